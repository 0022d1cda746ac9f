"""RouteGuard: the ASGI middleware that puts every route of a generation server behind its API key.

vLLM's ``--api-key`` guards only the paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``; the development
and RL routes that weight sync needs (``VLLM_SERVER_DEV_MODE=1``: ``/collective_rpc``, ``/pause``, ``/resume``,
``/update_weight_version``, ``/reset_prefix_cache``, ``/sleep``, ``/wake_up``, ``/server_info``, ...) and the
others (``/tokenize``, ``/metrics``, ``/version``, ``/ping``, ``/invocations``, the OpenAPI pages) answer anyone who
reaches the port. :class:`~lit_rlft.rollout.servers.launcher.VLLMServer` starts every server with
``--middleware lit_rlft.rollout.servers.route_guard.RouteGuard``, which vLLM adds outside its own middleware, so it
sees every request first:

- every path but :data:`OPEN_PATHS` (``/health``, what a load balancer and the trainer's liveness check poll)
  requires ``Authorization: Bearer <key>`` when the server has a key (``VLLM_API_KEY`` in its environment, where
  the launcher puts it): HTTP 401 otherwise, as vLLM answers on ``/v1``;
- ``POST /collective_rpc`` runs only the methods of lit_rlft's worker extension (:data:`RPC_METHODS`), key or no
  key: any other method (``check_health``, ``get_kv_cache_spec``, any worker method) is refused with HTTP 403
  naming it, before vLLM calls anything on a worker. The extension's methods check the weight-sync token
  themselves.

It is plain ASGI with the standard library only (vLLM imports it in its API server process; nothing here needs
vLLM, Starlette or torch), so the CPU tests drive it directly.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["OPEN_PATHS", "RPC_METHODS", "RouteGuard"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Paths that answer without the key: the liveness check.
OPEN_PATHS = frozenset({"/health"})
#: The only methods ``/collective_rpc`` may run: lit_rlft's worker extension's
#: (:class:`~lit_rlft.rollout.servers.vllm_extension.LitRLFTWorkerExtension`, each checking the sync token).
RPC_METHODS = frozenset({"lit_join", "lit_update_weights", "lit_update_adapter", "lit_leave"})
#: The largest ``/collective_rpc`` body read (the extension's calls carry names and shapes, not tensors).
MAX_RPC_BODY = 8 * 2**20


class RouteGuard:
    """The middleware (see the module docstring). ``api_key``: the key (None: ``$VLLM_API_KEY``; no key there
    either: no key is required, the ``/collective_rpc`` methods are still checked)."""

    def __init__(self, app: ASGIApp, api_key: str | None = None) -> None:
        self.app = app
        key = api_key if api_key is not None else os.environ.get("VLLM_API_KEY")
        self._key = hashlib.sha256(key.encode()).digest() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        if path in OPEN_PATHS or (scope["type"] == "http" and scope.get("method") == "OPTIONS"):
            await self.app(scope, receive, send)
            return
        if self._key is not None and not self._authorised(scope):
            await _respond(scope, receive, send, 401, {"error": "Unauthorized"})
            return
        if path == "/collective_rpc" and scope["type"] == "http":
            body, more = await _read_body(receive)
            problem = _rpc_problem(body, more)
            if problem is not None:
                await _respond(scope, receive, send, *problem)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def _authorised(self, scope: Scope) -> bool:
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        return hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._key or b"")


def _rpc_problem(body: bytes, more: bool) -> tuple[int, dict[str, str]] | None:
    """``(status, answer)`` refusing a ``/collective_rpc`` body, or None to let it through."""
    allowed = ", ".join(sorted(RPC_METHODS))
    if more:
        return 413, {"error": f"/collective_rpc: the request body is over {MAX_RPC_BODY} bytes"}
    try:
        request = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return 400, {"error": "/collective_rpc: the request body is not JSON"}
    method = request.get("method") if isinstance(request, dict) else None
    if method not in RPC_METHODS:
        return 403, {"error": f"/collective_rpc: method {method!r} is not allowed on a lit_rlft server: only the "
                              f"lit_rlft worker extension's methods ({allowed}) may be called"}
    return None


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request's body (at most :data:`MAX_RPC_BODY` bytes) and whether more was left unread."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            return b"".join(chunks), False
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_RPC_BODY:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the already read ``body`` once, then defers to the real one (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _respond(scope: Scope, receive: Receive, send: Send, status: int, answer: dict[str, str]) -> None:
    """A JSON answer (a websocket is closed instead: 1008, policy violation)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    payload = json.dumps(answer).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
