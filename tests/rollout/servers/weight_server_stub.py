"""A stand-in generation server for the CPU weight-sync tests: the HTTP routes WeightSync calls, answered by
lit_rlft's own worker extension (:class:`~lit_rlft.rollout.servers.vllm_extension.LitRLFTWorkerExtension`) on a worker without
vLLM, whose ``reload_weights`` keeps what it is given.

    LIT_RLFT_SYNC_TOKEN=secret python -m tests.rollout.servers.weight_server_stub --port 0    # prints "PORT <n>"

Routes: ``POST /collective_rpc`` (the extension's ``lit_*`` methods, one at a time, as vLLM's engine core runs
them), ``/pause``, ``/resume``, ``/update_weight_version``, ``/v1/load_lora_adapter`` (checks ``VLLM_API_KEY``, as
``--api-key`` does on ``/v1``), ``GET /health``, ``/weight_info``; for the tests: ``GET /state`` (digests of the
weights held, the loads, the calls, the version) and ``POST /control {"die_after_chunks": k}`` (the next receive
exits the process after k chunks: a server that dies mid-push; ``stop_after_chunks``: it stops the process, as a
SIGSTOP would).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import torch

if __name__ == "__main__":
    # lit_rlft's package __init__ imports Lightning (3 s a process on two cores); the extension and the group need
    # torch only: stand-in packages let the stand-in server start in a second
    for package in ("lit_rlft", "lit_rlft.rollout", "lit_rlft.rollout.servers"):
        module = types.ModuleType(package)
        module.__path__ = [str(Path(__file__).resolve().parents[3].joinpath(*package.split(".")))]
        sys.modules.setdefault(package, module)

from lit_rlft.rollout.servers.vllm_extension import LitRLFTWorkerExtension  # noqa: E402


def digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.blake2b(data.data, digest_size=16).hexdigest()


class DyingGroup:
    """A group that exits the process (or stops it: ``stop``) when asked for chunk ``k + 1`` (after receiving
    ``k``)."""

    def __init__(self, group: Any, k: int, stop: bool = False) -> None:
        self.group, self.left, self.stop = group, k, stop

    def broadcast(self, tensors: Any, opts: Any) -> Any:
        if self.left == 0:
            if self.stop:
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                os._exit(17)
        self.left -= 1
        return self.group.broadcast(tensors, opts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.group, name)


class StubWorker(LitRLFTWorkerExtension):
    """The part of vLLM's worker the extension uses."""

    device = torch.device("cpu")
    vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(world_size=1, data_parallel_size=1),
                                  model_config=SimpleNamespace(hf_config=SimpleNamespace(tie_word_embeddings=True)))

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.loads: list[list[str]] = []
        self.die_after: int | None = None
        self.stop_after: int | None = None

    def reload_weights(self, weights_iterator: Any) -> None:
        items = list(weights_iterator)
        self.loads.append([name for name, _ in items])
        for name, tensor in items:
            self.weights[name] = tensor.clone()

    def lit_update_weights(self, **kwargs: Any) -> dict[str, Any]:
        if self.die_after is not None or self.stop_after is not None:
            receiver = self._lit_receiver()
            stop = self.stop_after is not None
            receiver.group = DyingGroup(receiver.group, self.stop_after if stop else self.die_after, stop)
            self.die_after = self.stop_after = None
        return super().lit_update_weights(**kwargs)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.worker = StubWorker()
        self.rpc_lock = threading.Lock()  # vLLM's engine core runs one RPC at a time
        self.version = "default"
        self.paused = False
        self.calls: list[str] = []
        self.adapters: list[dict[str, Any]] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client gone before its answer (the trainer gave up on it)


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n)) if n else None

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = urlsplit(self.path).path
        s = self.server
        if path == "/health":
            self._answer(200, {})
        elif path == "/weight_info":
            self._answer(200, {"weight_version": s.version})
        elif path == "/state":
            w = s.worker
            self._answer(200, {"digests": {n: digest(t) for n, t in w.weights.items()}, "loads": w.loads,
                               "version": s.version, "paused": s.paused, "calls": s.calls, "adapters": s.adapters,
                               "boot_id": w._lit_receiver().boot_id})
        else:
            self._answer(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        s = self.server
        body = self._body()
        s.calls.append(path if path != "/collective_rpc" else f"rpc:{body.get('method')}")
        if path == "/collective_rpc":
            method = str(body.get("method"))
            if not method.startswith("lit_"):
                self._answer(500, {"error": {"message": f"no method {method}"}})
                return
            try:
                with s.rpc_lock:
                    result = getattr(s.worker, method)(**body.get("kwargs", {}))
            except Exception as exc:  # noqa: BLE001 - what vLLM answers
                self._answer(500, {"error": {"message": f"Worker failed with error '{exc}'"}})
                return
            self._answer(200, {"results": [result]})
        elif path == "/pause":
            s.paused = True
            self._answer(200, {"status": "paused"})
        elif path == "/resume":
            s.paused = False
            self._answer(200, {"status": "resumed"})
        elif path == "/update_weight_version":
            s.version = body["new_version"]
            self._answer(200, {"success": True})
        elif path == "/v1/load_lora_adapter":
            key = os.environ.get("VLLM_API_KEY")
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self._answer(401, {"error": "Unauthorized"})
                return
            if not os.path.isfile(os.path.join(body["lora_path"], "adapter_model.safetensors")):
                self._answer(404, {"error": {"message": f"no adapter at {body['lora_path']}"}})
                return
            s.adapters.append(body)
            self._answer(200, f"Success: LoRA adapter '{body['lora_name']}' added successfully.")
        elif path == "/control":
            s.worker.die_after = body.get("die_after_chunks")
            s.worker.stop_after = body.get("stop_after_chunks")
            self._answer(200, {})
        else:
            self._answer(404, {"detail": "Not Found"})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    server = Server(args.port)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
