"""JSON calls to generation servers, bounded in time, whose failures name the server and what was asked.

Standard library only (``urllib``). :func:`call` makes one request; :class:`Calls` makes one per server at once, in
threads (a server taking part in a broadcast answers only when the broadcast is over, so its call must not block the
trainer). A failure is a :class:`ServerCallError` whose message reads like
``127.0.0.1:8001 did not answer /collective_rpc (lit_update_weights) within 60 s while receiving weights version 7``.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

__all__ = ["Calls", "ServerCallError", "call", "host_port"]


class ServerCallError(RuntimeError):
    """A call that failed: ``server`` (``host:port``, None when no one server is to blame) and ``kind``
    (``timeout`` | ``refused`` (an HTTP error status) | ``unreachable`` | ``dropped`` | ``transfer``)."""

    def __init__(self, message: str, server: str | None = None, kind: str = "transfer") -> None:
        super().__init__(message)
        self.server = server
        self.kind = kind


def host_port(url: str) -> str:
    """``http://127.0.0.1:8001/`` -> ``127.0.0.1:8001`` (how errors name a server)."""
    return urllib.parse.urlsplit(url).netloc or url


def _detail(raw: bytes) -> str:
    """The useful part of an error body (vLLM answers ``{"error": {"message": ...}}``, FastAPI ``{"detail": ...}``)."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            value = body.get(key)
            if isinstance(value, dict):
                value = value.get("message", value)
            if value:
                return str(value)[:500]
    return text[:500]


def call(url: str, path: str, body: Any = None, *, timeout_s: float, action: str, api_key: str | None = None,
         label: str = "", method: str = "POST") -> Any:
    """``method`` ``url + path`` with a JSON ``body``; the answer's JSON (its text if it is not JSON, None if empty).

    ``action`` says what the trainer was doing (for the error); ``label`` names the call more precisely than its
    path (the RPC method of ``/collective_rpc``). ``timeout_s`` bounds connecting and each wait for the answer.

    Raises:
        ServerCallError: naming ``host:port``, the path and ``action``.
    """
    where, what = host_port(url), f"{path}{f' ({label})' if label else ''}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url.rstrip('/')}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        detail = _detail(exc.read() or b"")
        hint = " (is the server started with VLLM_SERVER_DEV_MODE=1 and the lit_rlft extension?)" \
            if exc.code == 404 else ""
        raise ServerCallError(f"{where} refused {what} (HTTP {exc.code}: {detail}){hint} while {action}", where,
                              "refused") from None
    except TimeoutError:
        raise ServerCallError(f"{where} did not answer {what} within {timeout_s:g} s while {action}", where,
                              "timeout") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise ServerCallError(f"{where} did not answer {what} within {timeout_s:g} s while {action}", where,
                                  "timeout") from None
        raise ServerCallError(f"{where} is unreachable ({exc.reason}) while {action}", where, "unreachable") from None
    except (http.client.HTTPException, ConnectionError, OSError) as exc:
        raise ServerCallError(f"{where} dropped the connection ({type(exc).__name__}: {exc}) during {what} while "
                              f"{action}", where, "dropped") from None
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


class Calls:
    """One call per server, started at once in threads (daemon threads: one that outlives its deadline ends at its
    own socket timeout).

    Args:
        urls: the servers.
        path: the path on each.
        bodies: one JSON body per server.
        timeout_s: the socket bound of each call.
        action, api_key, label: as for :func:`call`.
    """

    def __init__(self, urls: Sequence[str], path: str, bodies: Sequence[Any], *, timeout_s: float, action: str,
                 api_key: str | None = None, label: str = "") -> None:
        self.urls, self.path, self.label, self.action = list(urls), path, label, action
        self.results: list[Any] = [None] * len(self.urls)
        self.errors: list[ServerCallError | None] = [None] * len(self.urls)
        self.done = [threading.Event() for _ in self.urls]

        def run(i: int) -> None:
            try:
                self.results[i] = call(self.urls[i], path, bodies[i], timeout_s=timeout_s, action=action,
                                       api_key=api_key, label=label)
            except ServerCallError as exc:
                self.errors[i] = exc
            except BaseException as exc:  # noqa: BLE001 - reported by the caller's thread
                self.errors[i] = ServerCallError(f"{host_port(self.urls[i])}: {exc!r} while {action}",
                                                 host_port(self.urls[i]))
            finally:
                self.done[i].set()

        for i in range(len(self.urls)):
            threading.Thread(target=run, args=(i,), daemon=True, name=f"lit_rlft-call-{i}").start()

    def failed(self) -> ServerCallError | None:
        """The first failure so far (None if none)."""
        return next((e for e in self.errors if e is not None), None)

    def raise_failed(self) -> None:
        """Raise the first failure so far, if any (a ``poll`` for :func:`~lit_rlft.rollout.servers.weight_group.wait_work`)."""
        if (err := self.failed()) is not None:
            raise err

    def pending(self) -> list[str]:
        """The servers that have not answered yet."""
        return [url for url, done in zip(self.urls, self.done) if not done.is_set()]

    def wait(self, timeout_s: float) -> bool:
        """Wait until every call has ended or one has failed, at most ``timeout_s``; whether all ended."""
        deadline = time.monotonic() + timeout_s
        for done in self.done:
            while not done.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
                if self.failed() is not None or time.monotonic() >= deadline:
                    return all(d.is_set() for d in self.done)
        return True

    def join(self, timeout_s: float) -> list[Any]:
        """The answers, once every call has ended (at most ``timeout_s`` from now).

        Raises:
            ServerCallError: the first failure, or the first server that did not answer in time.
        """
        self.wait(timeout_s)
        self.raise_failed()
        late = self.pending()
        if late:
            what = f"{self.path}{f' ({self.label})' if self.label else ''}"
            where = host_port(late[0])
            others = f" (nor did {', '.join(host_port(u) for u in late[1:])})" if len(late) > 1 else ""
            raise ServerCallError(f"{where} did not answer {what} within {timeout_s:g} s while {self.action}{others}",
                                  where, "timeout")
        return self.results
