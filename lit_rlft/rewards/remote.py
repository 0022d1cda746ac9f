"""A reward served over HTTP: batched requests, a concurrency limit, time bound, retries, failures alone.

Two request shapes:

- ``openrlhf`` (OpenRLHF's ``--remote_rm_url`` / ``serve_rm.py``): ``POST {"query": [prompt + completion, ...],
  "prompts": [...], "labels": [...]}`` answered by ``{"rewards": [...]}`` (or ``"scores"``);
- ``plain``: ``POST {"completions": [...], "prompts": [...], <column>: [...], ...}`` answered by
  ``{"scores": [...]}`` (or ``"rewards"``).

Completions go in requests of ``batch_size``, ``max_concurrency`` at a time. A request that fails (after its
retries: a timeout, HTTP 5xx, a dropped connection, an answer that is not a list of one score per completion) is
sent again one completion per request, so that one completion the server cannot score scores 0 alone; a
completion whose own request fails is counted (``rewards/num_errors``, ``num_timeouts`` or ``num_unscored``) and
named on the console. A server that refuses connections fails its whole batch at once (no split: nothing listens).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from lit_rlft.rewards.batched import BatchedReward, Failure
from lit_rlft.rewards.http import HTTPClient, RequestFailed

__all__ = ["RemoteReward"]

Protocol = Literal["plain", "openrlhf"]


class RemoteReward(BatchedReward):
    """Score completions with an HTTP endpoint.

    Args:
        url: the endpoint, e.g. ``http://rm-host:5000/get_reward``.
        protocol: ``openrlhf`` or ``plain`` (module docstring).
        batch_size: completions per request.
        max_concurrency: requests in flight at once.
        timeout_s: bound on one request; retries: further attempts; backoff_s: first wait, doubled each retry.
        columns: the data set columns sent with a ``plain`` request (default: every column that is JSON-ready,
            except ``completion_ids``); ``openrlhf`` sends ``label_column`` as ``labels``.
        label_column: the column sent as OpenRLHF's ``labels`` (skipped when absent).
        headers: added to every request (authorisation).
        name: the name in ``rewards/<name>/...`` (default ``remote``).
        cache: keep scores by (prompt, completion) (only for a frozen scorer).

    Example:
        >>> reward = RemoteReward("http://localhost:5000/get_reward", protocol="openrlhf")  # doctest: +SKIP
    """

    def __init__(self, url: str, protocol: Protocol = "plain", *, batch_size: int = 64, max_concurrency: int = 4,
                 timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
                 columns: Sequence[str] | None = None, label_column: str = "answer",
                 headers: Mapping[str, str] | None = None, name: str = "remote", cache: bool = False) -> None:
        if protocol not in ("plain", "openrlhf"):
            raise ValueError(f"RemoteReward: protocol must be 'plain' or 'openrlhf', got {protocol!r}")
        if batch_size < 1:
            raise ValueError(f"RemoteReward: batch_size must be >= 1, got {batch_size}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"RemoteReward: url must start with http:// or https://, got {url!r}")
        self.url = url
        self.protocol = protocol
        self.batch_size = int(batch_size)
        self.columns = list(columns) if columns is not None else None
        self.label_column = label_column
        self.name = name
        self.cacheable = bool(cache)
        self.client = HTTPClient(timeout_s, retries, backoff_s, max_concurrency, headers)

    def payload(self, completions: list[str], columns: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
        """The JSON body for these completions."""
        prompts = [str(p) for p in columns.get("prompts", [""] * len(completions))]
        if self.protocol == "openrlhf":
            body: dict[str, Any] = {"query": [p + c for p, c in zip(prompts, completions)], "prompts": prompts}
            if self.label_column in columns:
                body["labels"] = list(columns[self.label_column])
            return body
        body = {"completions": completions, "prompts": prompts}
        names = self.columns if self.columns is not None else [k for k in columns if k not in ("prompts",
                                                                                               "completion_ids")]
        for key in names:
            if key not in columns:
                raise ValueError(f"RemoteReward: column {key!r} (in columns=) is not among the data set's columns "
                                 f"{sorted(columns)}")
            values = list(columns[key])
            if self.columns is None and not _json_ready(values):
                continue
            body[key] = values
        return body

    def _parse(self, answer: Any, n: int) -> list[float | None | Failure]:
        """One score per completion from an answer; raises :class:`RequestFailed` when the answer as a whole is
        malformed (not a mapping, no score list, the wrong length)."""
        scores = None
        if isinstance(answer, Mapping):
            scores = answer.get("scores", answer.get("rewards"))
        elif isinstance(answer, list):
            scores = answer
        if not isinstance(scores, list) or len(scores) != n:
            got = f"{len(scores)} scores" if isinstance(scores, list) else f"{type(answer).__name__} {str(answer)[:60]}"
            raise RequestFailed(Failure("unscored", f"{self.url} answered {got} for {n} completions"))
        out: list[float | None | Failure] = []
        for s in scores:
            value = _number(s)
            out.append(value if value is not None else Failure("unscored", f"{self.url} gave score {str(s)[:40]!r}"))
        return out

    def _request(self, rows: list[int], completions: list[str], columns: Mapping[str, Sequence[Any]]
                 ) -> list[float | None | Failure]:
        sub = [completions[i] for i in rows]
        cols = {k: [v[i] for i in rows] for k, v in columns.items() if isinstance(v, (list, tuple))}
        return self._parse(self.client.post(self.url, self.payload(sub, cols)), len(rows))

    def _try(self, rows: list[int], completions: list[str], columns: Mapping[str, Sequence[Any]]
             ) -> list[float | None | Failure] | RequestFailed:
        try:
            return self._request(rows, completions, columns)
        except RequestFailed as exc:
            return exc

    def score(self, completions: list[str], columns: Mapping[str, Sequence[Any]]) -> list[float | None | Failure]:
        n = len(completions)
        out: list[float | None | Failure] = [None] * n
        batches = [list(range(s, min(n, s + self.batch_size))) for s in range(0, n, self.batch_size)]
        retry: list[int] = []
        for rows, got in zip(batches, self.client.map(lambda r: self._try(r, completions, columns), batches)):
            if isinstance(got, RequestFailed) and len(rows) > 1 and not got.refused:
                retry.extend(rows)  # failed as a whole: one completion per request, so a failure stays with its own
                continue
            for i, s in zip(rows, [got.failure] * len(rows) if isinstance(got, RequestFailed) else got):
                out[i] = s
        for i, got in zip(retry, self.client.map(lambda i: self._try([i], completions, columns), retry)):
            out[i] = got.failure if isinstance(got, RequestFailed) else got[0]
        return out

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return f"RemoteReward({self.url!r}, protocol={self.protocol!r}, batch_size={self.batch_size})"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _json_ready(values: list[Any]) -> bool:
    return all(v is None or isinstance(v, (str, int, float, bool, list, dict)) for v in values[:4])
