"""Which generation servers serve: the servers of one client, the ones dropped and why, their health checks, and
taking a dropped server back once it answers again (:class:`ServerRoster`). The client
(:class:`~lit_rlft.rollout.servers.client.ServerEngine`) asks it for the live servers before each round of requests
and each push, and tells it which one failed."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

from lit_rlft.rollout.servers.calls import ServerCallError, call

__all__ = ["Server", "ServerError", "ServerRoster", "server_url"]


class ServerError(RuntimeError):
    """Generation on the servers failed: the message names the server(s), what was asked and why."""


@dataclass
class Server:
    url: str  # http://host:port
    alive: bool = True
    cause: str = ""  # why it was dropped

    @property
    def name(self) -> str:
        return self.url.removeprefix("http://").removeprefix("https://")


def server_url(address: str) -> str:
    """``host:port`` (or a URL) as ``http://host:port``; anything else is a ``ValueError`` naming it."""
    address = address.strip().rstrip("/")
    if not address.startswith(("http://", "https://")):
        address = "http://" + address
    host_port = address.split("://", 1)[1]
    if ":" not in host_port or not host_port.rsplit(":", 1)[1].isdigit():
        raise ValueError(f"ServerEngine: a server is host:port (e.g. 127.0.0.1:8000), got {address!r}")
    return address


class ServerRoster:
    """The servers of one client (see the module docstring).

    Args:
        urls: the servers, ``host:port`` or URLs (each once).
        timeout_s: bound on one health check (at most 5 s).
    """

    def __init__(self, urls: list[str], timeout_s: float):
        self.servers = [Server(server_url(u)) for u in urls]
        if len({s.url for s in self.servers}) != len(self.servers):
            raise ValueError(f"ServerEngine: a server is listed twice in {urls}")
        self.timeout_s = timeout_s
        self.dropped = 0  # servers dropped since the start

    def live(self, doing: str, what: str | None = None) -> list[Server]:
        """The servers that serve; none is a :class:`ServerError` naming every server's cause (``what``: the
        message's start, default ``no generation server is left while <doing>``)."""
        live = [s for s in self.servers if s.alive]
        if not live:
            causes = "; ".join(s.cause for s in self.servers)
            raise ServerError(f"{what or f'no generation server is left while {doing}'} ({causes})")
        return live

    def drop(self, server: Server, cause: str, others: list[Server]) -> None:
        """``server`` serves no more (``cause``), with a warning saying where its work goes (``others``)."""
        if not server.alive:
            return
        server.alive, server.cause = False, cause
        self.dropped += 1
        left = [s for s in others if s is not server]
        warnings.warn(f"generation server failed: {cause}. "
                      + (f"Its prompts go to the {len(left)} other server(s) and it is dropped ({self.dropped} "
                         "dropped so far; it is taken back at a weight push once it answers /health again)"
                         if left else "No other server is left."), RuntimeWarning, stacklevel=3)

    def healthy(self, server: Server) -> bool:
        """Whether ``server`` answers ``/health`` (within a few seconds)."""
        try:
            call(server.url, "/health", timeout_s=min(5.0, self.timeout_s), action="checking it", method="GET")
        except ServerCallError:
            return False
        return True

    def take_back(self) -> None:
        """Every dropped server that answers ``/health`` again serves again (a warning each)."""
        for server in self.servers:
            if not server.alive and self.healthy(server):
                server.alive, server.cause = True, ""
                warnings.warn(f"generation server {server.name} answers again: taken back (the full weights are "
                              "pushed to every server)", RuntimeWarning, stacklevel=3)

    def wait_until_healthy(self, start_timeout_s: float) -> None:
        """Until every live server answers ``/health``, at most ``start_timeout_s``; the late ones are dropped."""
        deadline = time.monotonic() + start_timeout_s
        waiting = [s for s in self.servers if s.alive]
        while waiting and time.monotonic() < deadline:
            waiting = [s for s in waiting if not self.healthy(s)]
            if waiting:
                time.sleep(1.0)
        for server in waiting:
            self.drop(server, f"{server.name} did not answer /health within {start_timeout_s:g} s "
                              "(ServerEngine start_timeout_s)", self.servers)

    def metrics(self) -> dict[str, float]:
        """``servers/alive``, ``servers/dropped`` (since the start)."""
        return {"servers/alive": float(sum(s.alive for s in self.servers)), "servers/dropped": float(self.dropped)}
