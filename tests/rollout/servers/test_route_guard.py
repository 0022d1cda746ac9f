"""RouteGuard (the ASGI middleware every generation server runs): every route but /health behind the API key, and
/collective_rpc limited to lit_rlft's extension methods; driven as vLLM's API server drives it, without vLLM."""

from __future__ import annotations

import asyncio
import json

import pytest

from lit_rlft.rollout.servers.route_guard import RPC_METHODS, RouteGuard

KEY = "the-key"
#: vLLM 0.32's routes in development mode (the guarded prefixes and the ones vLLM leaves open).
ROUTES = ["/collective_rpc", "/reset_prefix_cache", "/sleep", "/wake_up", "/pause", "/resume", "/is_paused",
          "/update_weight_version", "/update_weights", "/init_weight_transfer_engine", "/server_info",
          "/start_profile", "/tokenize", "/detokenize", "/metrics", "/version", "/load", "/ping", "/invocations",
          "/docs", "/openapi.json", "/v1/models", "/v1/load_lora_adapter", "/inference/v1/generate"]


class App:
    """The app behind the middleware: records what reached it (and the body it read)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    async def __call__(self, scope, receive, send):
        body = b""
        if scope["type"] == "http":
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
        self.calls.append((scope["path"], body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _request(guard, path: str, key: str | None = None, body: bytes = b"", method: str = "POST",
             chunks: int = 1) -> tuple[int, dict | str]:
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers}
    parts = [body[len(body) * i // chunks: len(body) * (i + 1) // chunks] for i in range(chunks)]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    status = sent[0]["status"]
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return status, (json.loads(payload) if payload.startswith(b"{") else payload.decode())


def _rpc(method: str) -> bytes:
    return json.dumps({"method": method, "kwargs": {"token": "x"}}).encode()


@pytest.mark.parametrize("path", ROUTES)
def test_every_route_needs_the_key(path):
    app = App()
    guard = RouteGuard(app, api_key=KEY)
    for key in (None, "wrong", ""):
        assert _request(guard, path, key, _rpc("lit_join")) == (401, {"error": "Unauthorized"}), (path, key)
    assert app.calls == []  # nothing reached vLLM
    status, _ = _request(guard, path, KEY, _rpc("lit_join"))
    assert status == 200 and app.calls == [(path, _rpc("lit_join"))]  # the body reaches vLLM as it was sent


def test_health_stays_open_and_the_key_is_read_from_the_environment(monkeypatch):
    app = App()
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    guard = RouteGuard(app)
    assert _request(guard, "/health", None, method="GET")[0] == 200
    assert _request(guard, "/v1/models", None, method="GET")[0] == 401
    assert _request(guard, "/v1/models", KEY, method="GET")[0] == 200
    assert _request(guard, "/v1/models", "Basic " + KEY, method="GET")[0] == 401  # "Bearer Basic ..." is not it


@pytest.mark.parametrize("key", [KEY, None], ids=["with a key", "without a key"])
def test_collective_rpc_runs_only_the_extensions_methods(key):
    app = App()
    guard = RouteGuard(app, api_key=key or "")
    for method in sorted(RPC_METHODS):
        assert _request(guard, "/collective_rpc", key, _rpc(method), chunks=3)[0] == 200
    for method in ("check_health", "get_kv_cache_spec", "reload_weights", "__init__", None):
        status, answer = _request(guard, "/collective_rpc", key, _rpc(method))
        assert status == 403 and f"method {method!r} is not allowed" in answer["error"], answer
        assert "lit_join, lit_leave, lit_update_adapter, lit_update_weights" in answer["error"]
    assert _request(guard, "/collective_rpc", key, b"not json")[0] == 400
    assert [path for path, _ in app.calls] == ["/collective_rpc"] * len(RPC_METHODS)


def test_the_allowed_methods_are_the_extensions():
    from lit_rlft.rollout.servers.vllm_extension import LitRLFTWorkerExtension

    assert {name for name in vars(LitRLFTWorkerExtension) if name.startswith("lit_")} == RPC_METHODS


def test_a_lifespan_event_passes_through():
    app_seen = []

    async def app(scope, receive, send):
        app_seen.append(scope["type"])

    asyncio.run(RouteGuard(app, api_key=KEY)({"type": "lifespan"}, None, None))
    assert app_seen == ["lifespan"]
