"""Stand-ins for vLLM generation servers, for the CPU tests of the rollout side (the real servers are tested in the vLLM
environment): ``/inference/v1/generate`` answered from the request's seed alone (the same seed, the same completions,
on any server), ``/health``, and a weight sync that records its pushes and sets the servers' version.

    with FakeServers(2) as servers:
        engine = ServerEngine(servers.urls, ...)
        engine._sync = servers.sync           # instead of a torch.distributed group
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VOCAB = range(3, 40)  # the tiny char tokenizer's ids, past pad (0) and eos (1)


def completions(body: dict[str, Any], version: str) -> dict[str, Any]:
    """``n`` completions of ``body``'s prompt from its seed (child ``k`` seeded ``seed + k``, as vLLM does)."""
    params = body["sampling_params"]
    n, seed, max_tokens = params["n"], params.get("seed"), params["max_tokens"]
    stop = set(params.get("stop_token_ids") or [])
    choices = []
    for k in range(n):
        rng = random.Random(None if seed is None else (seed + k) * 1_000_003 + sum(body["token_ids"]))
        tokens = []
        while len(tokens) < max_tokens:
            token = rng.choice([*VOCAB, *stop]) if stop else rng.choice(VOCAB)
            tokens.append(token)
            if token in stop:
                break
        finish = "stop" if tokens[-1] in stop else "length"
        choices.append({"index": k, "token_ids": tokens, "finish_reason": finish,
                        "logprobs": {"content": [{"token_id": t, "logprob": -rng.random()} for t in tokens]},
                        "weight_versions": [{"version": version, "start": 0, "end": len(tokens)}]})
    rng_order = random.Random(seed)
    rng_order.shuffle(choices)  # the server's order is not the index order
    return {"choices": choices}


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (a timeout under test) is not news


@dataclass
class FakeServer:
    """One server: ``mode`` ``ok``, ``garbage`` (answers JSON that is not completions), ``hang`` (answers after
    ``hang_s``), ``unauthorized`` (HTTP 401); ``version`` its weights version label."""

    mode: str = "ok"
    version: str = "default"
    hang_s: float = 5.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    pushes: int = 0  # versions set through /lit_fake_version (HTTPFakeSync)
    httpd: ThreadingHTTPServer | None = None
    port: int = 0

    def start(self, port: int = 0) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer(200 if self.path == "/health" else 404, {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/lit_fake_version":  # HTTPFakeSync's push
                    server.version, server.pushes = str(body["version"]), server.pushes + 1
                    return self._answer(200, {})
                server.requests.append(body)
                if server.mode == "unauthorized":
                    return self._answer(401, {"error": "Unauthorized"})
                if server.mode == "garbage":
                    return self._answer(200, {"choices": [{"what": "?"}]})
                if server.mode == "hang":
                    time.sleep(server.hang_s)
                self._answer(200, completions(body, server.version))

        self.httpd = _Quiet(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        """Stop listening (as a killed server: connections refused)."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def restart(self, port: int) -> None:
        """Listen again on ``port`` with fresh weights (version ``default``), as a restarted server."""
        self.version = "default"
        self.start(port)


@dataclass
class Stats:
    bytes: int
    tensors: int
    seconds: float
    full: bool


class FakeSync:
    """The weight sync, without a group: records ``(version, full, names)`` of each push and sets the version of the
    servers it is connected to."""

    def __init__(self, servers: list[FakeServer]):
        self.servers = servers
        self.members: list[str] = []
        self.pushes: list[tuple[int, bool, list[str]]] = []
        self.adapters: list[tuple[int, list[str], dict[str, Any]]] = []
        self.closed = 0
        self.connected = False

    def connect(self, urls: list[str]) -> None:
        self.members, self.connected = list(urls), True

    def sync_weights(self, named: Any, version: int, full: bool = False) -> Stats:
        names = [n for n, _ in (named() if callable(named) else named)]
        for server in self.servers:
            if any(server.url in m for m in self.members):
                server.version = str(version)
        self.pushes.append((version, full, names))
        return Stats(bytes=0, tensors=len(names), seconds=0.0, full=full)

    def sync_adapter(self, tensors: Any, config: dict[str, Any], version: int) -> Stats:
        self.adapters.append((version, sorted(tensors), config))
        return self.sync_weights([], version, full=False)

    def close(self) -> None:
        self.closed += 1
        self.connected = False


class HTTPFakeSync:
    """The stand-in weight sync for trainer processes other than the servers' (several ranks): a push sets each
    member's version over HTTP (``/lit_fake_version``)."""

    def __init__(self) -> None:
        self.members: list[str] = []
        self.connected = False

    def connect(self, urls: list[str]) -> None:
        self.members, self.connected = list(urls), True

    def sync_weights(self, named: Any, version: int, full: bool = False) -> Stats:
        import urllib.request

        names = [n for n, _ in (named() if callable(named) else named)]
        for url in self.members:
            request = urllib.request.Request(url + "/lit_fake_version", data=json.dumps({"version": version}).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
            urllib.request.urlopen(request, timeout=10).read()
        return Stats(bytes=0, tensors=len(names), seconds=0.0, full=full)

    def close(self) -> None:
        self.connected = False


class FakeServers:
    """``n`` fake servers and their sync, started on free ports; stopped on exit."""

    def __init__(self, n: int = 1, modes: list[str] | None = None):
        self.servers = [FakeServer(mode=m) for m in (modes or ["ok"] * n)]
        self.sync = FakeSync(self.servers)

    def __enter__(self) -> FakeServers:
        for server in self.servers:
            server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for server in self.servers:
            server.kill()

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]
