"""JSON over HTTP for remote scorers and judges: a time bound, retries with backoff, a concurrency limit.

Standard library only (``urllib``), so a remote reward adds no dependency and pickles to worker or generation
processes (the thread pool is made on first use in each process).

What is retried: a dropped or reset connection, a timeout, HTTP 429 and 5xx. What is not: other HTTP errors (4xx: the
request itself is wrong) and a refused connection (nothing listens there: retrying the same address cannot help).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from lit_rlft.rewards.batched import Failure

__all__ = ["HTTPClient", "RequestFailed"]

T = TypeVar("T")


@dataclass
class RequestFailed(Exception):
    """A request that failed after its retries; ``failure`` says how (kind and message), ``refused`` whether nothing
    listened at the address."""

    failure: Failure
    refused: bool = False

    def __str__(self) -> str:
        return self.failure.message


class HTTPClient:
    """POST JSON, read JSON.

    Args:
        timeout_s: bound on one request (connecting and reading), in seconds.
        retries: further attempts after a failed one (dropped connection, timeout, 429, 5xx).
        backoff_s: wait before the first retry; doubled for each next one.
        max_concurrency: requests in flight at once (:meth:`map`).
        headers: added to every request (e.g. ``{"Authorization": "Bearer ..."}``).
    """

    def __init__(self, timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 0.5, max_concurrency: int = 8,
                 headers: Mapping[str, str] | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if backoff_s < 0:
            raise ValueError(f"backoff_s must be >= 0, got {backoff_s}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.max_concurrency = int(max_concurrency)
        self.headers = dict(headers or {})
        self.num_requests = 0
        self.num_retries = 0
        self._threads: ThreadPoolExecutor | None = None

    def post(self, url: str, payload: Any) -> Any:
        """The decoded JSON answer to ``payload``; raises :class:`RequestFailed` once the retries are spent (a body
        that is not JSON fails at once, kind ``unscored``)."""
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **self.headers}
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            self.num_requests += 1
            try:
                request = urllib.request.Request(url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                retry = exc.code == 429 or exc.code >= 500
                error = RequestFailed(Failure("error", f"HTTP {exc.code} from {url}"))
            except TimeoutError:
                retry, error = True, RequestFailed(Failure("timeout", f"no answer from {url} in {self.timeout_s:g} s"))
            except urllib.error.URLError as exc:
                reason = exc.reason
                if isinstance(reason, TimeoutError):
                    retry, error = True, RequestFailed(Failure("timeout", f"no answer from {url} in "
                                                                          f"{self.timeout_s:g} s"))
                else:
                    refused = isinstance(reason, ConnectionRefusedError)
                    retry = not refused
                    error = RequestFailed(Failure("error", f"cannot reach {url}: {reason}"), refused=refused)
            except (http.client.HTTPException, ConnectionError, OSError) as exc:  # dropped mid-answer, reset
                retry = True
                error = RequestFailed(Failure("error", f"connection to {url} dropped ({type(exc).__name__})"))
            else:
                try:
                    return json.loads(raw)
                except ValueError:
                    raise RequestFailed(Failure("unscored", f"{url} answered with something that is not JSON: "
                                                            f"{raw[:80]!r}")) from None
            if not retry or attempt == self.retries:
                raise error
            self.num_retries += 1
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def map(self, fn: Callable[[Any], T], items: Sequence[Any]) -> list[T]:
        """``[fn(item) for item in items]``, at most ``max_concurrency`` at once, in order."""
        if len(items) <= 1 or self.max_concurrency == 1:
            return [fn(item) for item in items]
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="lit_rlft-http")
        return list(self._threads.map(fn, items))

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_threads"] = None
        return state
