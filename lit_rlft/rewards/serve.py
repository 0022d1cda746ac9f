"""Serve a reward over HTTP, in OpenRLHF's shape and the plain one (what :class:`~lit_rlft.rewards.RemoteReward` calls).

    python -m lit_rlft.rewards.serve --model runs/rm --port 5000            # a reward model
    python -m lit_rlft.rewards.serve --reward lit_rlft.rewards.countdown_reward --port 5000

- ``POST /get_reward`` (OpenRLHF): ``{"query": [...], "prompts": [...], "labels": [...]}`` -> ``{"rewards": [...]}``;
  each query is the prompt followed by the completion (the prompt is cut off when the query starts with it);
- ``POST /score`` (plain): ``{"completions": [...], "prompts": [...], <column>: [...]}`` -> ``{"scores": [...]}``.

A completion the reward cannot score gets ``null``. Requests are served one at a time (a model's forward is not
shared between threads); a batch is scored in one call, so the reward batches as it does in training.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lit_rlft.rewards.batched import Failure, is_batched

__all__ = ["RewardServer", "main"]


def _score(reward: Any, completions: list[str], columns: dict[str, Any]) -> list[float | None]:
    scores = reward.score(completions, columns) if is_batched(reward) else reward(completions, **columns)
    return [None if isinstance(s, Failure) or s is None else float(s) for s in scores]


class RewardServer:
    """A reward behind a local HTTP server, in a background thread (``with RewardServer(reward) as url: ...``).

    Args:
        reward: a :class:`~lit_rlft.rewards.batched.BatchedReward` or a rule reward function.
        host, port: where to listen (port 0: any free port; :attr:`url` says which).
    """

    def __init__(self, reward: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.reward = reward
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet: a reward server answers thousands of requests
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    answer = server.answer(self.path, body)
                except (ValueError, KeyError, TypeError) as exc:
                    self._send(400, {"error": f"{type(exc).__name__}: {exc}"})
                    return
                except Exception as exc:  # the reward failed: the client retries or scores 0
                    self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
                    return
                self._send(200, answer) if answer is not None else self._send(404, {"error": self.path})

            def _send(self, code: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The JSON answer to a request on ``path`` (None: no such route)."""
        if path.rstrip("/") == "/get_reward":
            queries: Sequence[str] = body["query"]
            prompts = list(body.get("prompts") or [""] * len(queries))
            completions = [q[len(p):] if p and q.startswith(p) else q for q, p in zip(queries, prompts)]
            columns: dict[str, Any] = {"prompts": prompts}
            if body.get("labels") is not None:
                columns["answer"] = list(body["labels"])
            with self._lock:
                return {"rewards": _score(self.reward, completions, columns)}
        if path.rstrip("/") == "/score":
            completions = list(body.pop("completions"))
            with self._lock:
                return {"scores": _score(self.reward, completions, body)}
        return None

    def start(self) -> RewardServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="lit_rlft-reward-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> str:
        self.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lit_rlft.rewards.serve", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a sequence-classification reward model directory (RewardModel)")
    what.add_argument("--reward", help="a reward function by dotted path (lit_rlft.rewards.countdown_reward)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    if args.model:
        from lit_rlft.rewards.model import RewardModel

        reward: Any = RewardModel(args.model, max_batch_tokens=args.max_batch_tokens, dtype=args.dtype, cache=False)
    else:
        from lit_rlft.rewards.runner import resolve_reward

        reward = resolve_reward(args.reward)
    server = RewardServer(reward, args.host, args.port)
    print(f"serving {reward!r} at {server.url}/get_reward (OpenRLHF) and {server.url}/score (plain)", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()
