"""Remote rewards and LLM judges over real local HTTP servers: batching, concurrency, and each failure (a malformed
answer, a timeout, a 500, a dropped connection, a refused connection) scoring 0 for its completion alone, counted
and named, never stopping the run."""

from __future__ import annotations

import json
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2, tiny_reward_model
from lit_rlft.rewards import (
    Failure,
    JudgeReward,
    OpenAIJudge,
    RemoteReward,
    RewardModel,
    RewardRunner,
    ScoreParser,
)
from lit_rlft.rewards.http import HTTPClient
from lit_rlft.rewards.serve import RewardServer
from lit_rlft.rollout import EngineJudge

SMALL = TinyConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                   intermediate_size=128, head_dim=64)


class Scripted(BaseHTTPRequestHandler):
    """A scorer whose misbehaviour is chosen by the completions it gets: ``BOOM`` -> HTTP 500, ``SLOW`` -> no answer
    within the client's bound, ``DROP`` -> connection closed without an answer, ``NAN`` -> a non-number for that
    completion, ``SHORT`` -> one score too few; otherwise the score is the completion's length. ``FLAKY`` fails with
    503 the first time it is seen. Judge requests (``/v1/chat/completions``) answer ``Score: <len % 11>``, or text
    without a score for ``GARBLED``."""

    requests: list[dict[str, Any]] = []
    seen: set[str] = set()
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            Scripted.requests.append({"path": self.path, **body})
        if self.path.endswith("/chat/completions"):
            texts = [body["messages"][-1]["content"]]
        else:
            texts = body.get("completions") or body.get("query")
        joined = " ".join(texts)
        if "DROP" in joined:
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if "SLOW" in joined:
            time.sleep(1.0)
        if "BOOM" in joined:
            return self._send(500, {"error": "boom"})
        if "FLAKY" in joined:
            with self.lock:
                first = "FLAKY" not in Scripted.seen
                Scripted.seen.add("FLAKY")
            if first:
                return self._send(503, {"error": "busy"})
        if self.path.endswith("/chat/completions"):
            text = texts[0]
            content = "I refuse" if "GARBLED" in text else f"Looks fine. Score: {len(text.split('Response:')[-1]) % 11}"
            return self._send(200, {"choices": [{"message": {"role": "assistant", "content": content}}]})
        scores: list[Any] = ["n/a" if "NAN" in t else float(len(t)) for t in texts]
        if "SHORT" in joined:
            scores = scores[:-1]
        key = "rewards" if self.path == "/get_reward" else "scores"
        return self._send(200, {key: scores})

    def _send(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass


@contextmanager
def scripted_server() -> Iterator[str]:
    Scripted.requests, Scripted.seen = [], set()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_failure_scores_zero_alone_and_is_counted() -> None:
    completions = ["ok", "BOOM", "fine!", "SLOW", "DROP", "NAN", "good one", "x"]
    with scripted_server() as url:
        reward = RemoteReward(f"{url}/score", batch_size=4, max_concurrency=2, timeout_s=0.4, retries=1,
                              backoff_s=0.01)
        runner = RewardRunner([reward], timeout_s=None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = runner(completions, {"prompts": ["p"] * 8, "answer": list(range(8))})
    scores = result.per_func["remote"].tolist()
    assert scores == [2.0, 0.0, 5.0, 0.0, 0.0, 0.0, 8.0, 1.0]
    assert result.failures == {"remote": {"num_errors": 2, "num_timeouts": 1, "num_unscored": 1}}
    message = " ".join(str(w.message) for w in caught)
    assert "remote" in message and "1 timed out" in message and "2 raised" in message
    # batches of 4 were tried first (each retried once: both hold a failure), then split into single requests
    sizes = [len(r["completions"]) for r in Scripted.requests]
    # the 500, the timeout and the dropped connection are retried once alone; a non-number score is an answer
    assert sizes[:4] == [4, 4, 4, 4] and set(sizes[4:]) == {1} and len(sizes) == 4 + 8 + 3
    assert Scripted.requests[0]["answer"] in (list(range(4)), list(range(4, 8)))  # columns sent along


def test_retry_then_success_and_malformed_batch() -> None:
    with scripted_server() as url:
        client = HTTPClient(timeout_s=2.0, retries=2, backoff_s=0.01)
        assert client.post(f"{url}/score", {"completions": ["FLAKY"]}) == {"scores": [5.0]}
        assert client.num_retries == 1
        # one score too few for the batch: the batch is split, and only the completion that causes it fails
        reward = RemoteReward(f"{url}/score", batch_size=3, retries=0)
        scores = reward.score(["ab", "SHORT", "abcd"], {})
        assert scores[0] == 2.0 and scores[2] == 4.0
        assert isinstance(scores[1], Failure) and scores[1].kind == "unscored" and "0 scores for 1" in scores[1].message


def test_refused_connection_fails_fast_without_splitting() -> None:
    reward = RemoteReward(f"http://127.0.0.1:{free_port()}/score", batch_size=8, retries=3, backoff_s=1.0)
    start = time.perf_counter()
    scores = reward.score([f"c{i}" for i in range(16)], {})
    assert time.perf_counter() - start < 1.0  # no retries, no per-completion requests
    assert all(isinstance(s, Failure) and s.kind == "error" and "cannot reach" in s.message for s in scores)


def test_openrlhf_shape_served_reward_model_matches_local_scores() -> None:
    tok = char_tokenizer()
    tok.padding_side = "right"
    local = RewardModel(tiny_reward_model(tok, SMALL), tok)
    completions, prompts = ["1+2", "(3*4)-5", "7"], ["Make 3: ", "Make 7: ", "Make 7: "]
    expected = local.score(completions, {"prompts": prompts})
    with RewardServer(local) as url:
        remote = RemoteReward(f"{url}/get_reward", protocol="openrlhf", batch_size=2)
        assert remote.score(completions, {"prompts": prompts, "answer": [3, 7, 7]}) == pytest.approx(expected)
        plain = RemoteReward(f"{url}/score", batch_size=8)
        assert plain.score(completions, {"prompts": prompts}) == pytest.approx(expected)


def test_remote_reward_validates_its_options() -> None:
    with pytest.raises(ValueError, match="protocol"):
        RemoteReward("http://x/y", protocol="grpc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="http"):
        RemoteReward("localhost:5000")
    with pytest.raises(ValueError, match="columns"):
        RemoteReward("http://x/y", columns=["nope"]).payload(["a"], {"prompts": ["p"]})


def test_score_parser() -> None:
    parse = ScoreParser()
    assert parse("Score: 8") == 0.8
    assert parse("score=3 ... final **Score:** 10") == 1.0  # the last one counts
    assert parse("Score: 11") is None and parse("no number") is None
    assert ScoreParser(r"(\d+)/5", scale=5, high=5)("I give it 4/5") == 0.8
    with pytest.raises(ValueError, match="group"):
        ScoreParser(r"\d+")


def test_openai_judge_failures_alone() -> None:
    completions = ["abc", "GARBLED", "BOOM", "abcdefghijkl"]
    with scripted_server() as url:
        judge = JudgeReward(OpenAIJudge(f"{url}/v1", model="judge", retries=0, timeout_s=2.0),
                            template="Q: {prompt} (target {answer})\nResponse:{completion}")
        result = RewardRunner([judge], timeout_s=None, report=False)(
            completions, {"prompts": ["p"] * 4, "answer": [1, 2, 3, 4]})
    assert result.per_func["judge"].tolist() == pytest.approx([0.3, 0.0, 0.0, 0.1])
    assert result.failures == {"judge": {"num_unscored": 1, "num_errors": 1}}
    sent = [r for r in Scripted.requests if r["path"] == "/v1/chat/completions"]
    assert {r["model"] for r in sent} == {"judge"} and "(target 1)" in sent[0]["messages"][0]["content"] + \
        "".join(r["messages"][0]["content"] for r in sent)
    with pytest.raises(ValueError, match="not a column"):
        JudgeReward(OpenAIJudge("http://x", "m"), template="{missing} {completion}").requests(["a"], {})


def test_engine_judge_generates_with_a_separate_model_and_is_reproducible() -> None:
    tok = char_tokenizer()
    judge_model = tiny_qwen2(tok, SMALL)
    before = [p.clone() for p in judge_model.parameters()]
    results = []
    for _ in range(2):
        judge = EngineJudge(judge_model, tok, max_new_tokens=12, temperature=1.0, seed=3)
        reward = JudgeReward(judge, parser=ScoreParser(r"(\d)", scale=9, high=9), cache=False)
        results.append(reward.score(["1+2", "3*3", "4", "5-1"], {"prompts": ["Make 3", "Make 9", "4", "4"]}))
        texts = reward.last_judgements
    assert [str(a) for a in results[0]] == [str(b) for b in results[1]]  # seeded: a rerun judges alike
    assert all(isinstance(t, str) for t in texts) and len(texts) == 4
    for score, text in zip(results[0], texts):
        digits = [c for c in text if c.isdigit()]
        if digits:
            assert score == pytest.approx(int(digits[-1]) / 9)
        else:
            assert isinstance(score, Failure) and score.kind == "unscored"
    assert all(torch.equal(a, b) for a, b in zip(before, judge_model.parameters()))
