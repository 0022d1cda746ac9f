"""``lit-rlft serve``: a vLLM generation server that a trainer pushes weights to (``docs/servers.md``).

    LIT_RLFT_SYNC_TOKEN=$(openssl rand -hex 32) .venv-vllm/bin/lit-rlft serve --model runs/sft/model --port 8001 \\
        --api-key "$KEY" --sync-rendezvous 127.0.0.1:29600 -- --max-model-len 2048

It runs vLLM's own OpenAI-compatible server (with lit_rlft's worker extension, see
:class:`~lit_rlft.rollout.servers.launcher.VLLMServer`) in this environment, prints its URL and pid once it answers
``/health``, and stops it on Ctrl-C. Arguments after ``--`` go to vLLM as they are. The sync token comes from
``--sync-token`` or ``LIT_RLFT_SYNC_TOKEN`` (the environment keeps it out of ``ps``); without either a random one is
made and printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn

from lit_rlft.rollout.servers.launcher import check_exposure
from lit_rlft.rollout.servers.weight_group import TOKEN_ENV

#: What a missing vLLM is told to use (the CPU build lives in its own environment).
VLLM_HINT = ("vLLM is not importable in this environment ({python}). On CPU: `make vllm-env`, then run "
             "`.venv-vllm/bin/lit-rlft serve ...`; on a GPU machine: `pip install 'lit_rlft[vllm]'`")


def fail(message: str) -> NoReturn:
    """``lit-rlft serve: error: <message>`` on stderr, exit status 2 (the CLI's convention)."""
    sys.stderr.write(f"lit-rlft serve: error: {message}\n")
    raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lit-rlft serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="lit-rlft serve --model DIR [options] [-- extra vLLM args]")
    p.add_argument("--model", required=True, help="the HF model folder to serve")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: this machine only; any other needs an API key and a sync "
                        "token)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="required on every route but /health (or VLLM_API_KEY; the environment keeps it out of ps)")
    p.add_argument("--sync-token", default=None, help=f"the weight-sync secret (default: ${TOKEN_ENV})")
    p.add_argument("--sync-rendezvous", default=None, metavar="HOST:PORT",
                   help="join only this trainer rendezvous (default: any trainer with the token)")
    p.add_argument("--lora-rank", type=int, default=None, help="serve LoRA adapters up to this rank")
    p.add_argument("--dtype", default="auto", help="vLLM's weight dtype (float32: log-probs match the trainer's)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=128 * 2**20, help="KV cache size on the CPU")
    p.add_argument("--cpu-threads-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND for this server (e.g. 0-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default="-", help="the server's log file (default: this terminal)")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds to wait for /health")
    return p


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = parser().parse_args(argv)
    token = args.sync_token or os.environ.get(TOKEN_ENV)
    api_key = args.api_key or os.environ.get("VLLM_API_KEY")
    try:
        check_exposure(args.host, api_key, token)
    except ValueError as e:
        fail(str(e))
    if importlib.util.find_spec("vllm") is None:
        fail(VLLM_HINT.format(python=sys.executable))
    if not Path(args.model, "config.json").is_file():
        fail(f"--model: {args.model} is not an HF model folder (no config.json)")
    from lit_rlft.rollout.servers.launcher import ServerStartError, VLLMServer

    server = VLLMServer(args.model, host=args.host, port=args.port, api_key=api_key, sync_token=token,
                        sync_rendezvous=args.sync_rendezvous, dtype=args.dtype, max_model_len=args.max_model_len,
                        device=args.device, kv_cache_memory_bytes=args.kv_cache_memory_bytes, seed=args.seed,
                        lora_rank=args.lora_rank, cpu_threads_bind=args.cpu_threads_bind, extra_args=extra,
                        log=args.log, start_timeout_s=args.start_timeout)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the server on `kill` too
    signal.signal(signal.SIGINT, signal.default_int_handler)  # and on Ctrl-C, even when started with `&` (ignored)
    try:
        try:
            server.start()
        except ServerStartError as e:
            fail(str(e))
        print(f"lit-rlft serve: {server.url} (pid {server.pid}, process group {server.pid})", flush=True)
        if not token:
            print(f"lit-rlft serve: weight-sync token (set {TOKEN_ENV} to choose it): {server.sync_token}",
                  flush=True)
        while server.process is not None and server.process.poll() is None:
            time.sleep(1.0)
        code = server.process.returncode if server.process is not None else 0
        print(f"lit-rlft serve: the server exited with status {code}", file=sys.stderr)
        raise SystemExit(code or 0)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
