"""Generation servers on this machine: what a weight push costs, and what a step costs with a local server.

    .venv-vllm/bin/python benchmarks/servers.py sync --model tiny --rounds 3
    .venv-vllm/bin/python benchmarks/servers.py sync --model smollm2-135m-instruct --rounds 3
    .venv-vllm/bin/python benchmarks/servers.py step --steps 10 --rounds 2

``sync``: one server (``VLLMServer``, 127.0.0.1) and the trainer's ``WeightSync`` over gloo; the policy's weights are
changed as an update would change them, then pushed, each kind of push ``--rounds`` times, alternated:

- ``full``: every tensor (what the first push, a resume and a server taken back send);
- ``changed, every layer``: changed-only after an update of every weight (full fine-tuning): it sends what ``full``
  sends, plus the digests' pass;
- ``changed, top 2 layers``: changed-only after an update of the last two decoder layers only (the rest frozen);
- ``changed, nothing``: changed-only with nothing changed (a push that only sets the version);
- ``adapter`` (``--lora-rank``): a LoRA policy's adapters alone (``lora_sync: adapter``), against its merged weights.

Each push is checked: the server's version is the one pushed. Seconds are pause to resume (``SyncStats.seconds``),
bytes what was sent.

``step``: the plain loop (``build_step`` + ``TorchBackend``) on the tiny policy at depth 0 and depth 1 with one local
server (``ServerEngine``) against the colocated ``VLLMEngine`` at depth 0, alternating in rounds, coin-flip rewards;
the median step time after ``--warmup`` steps. On 2 cores the server and the trainer share the cores: expect no gain,
the figures say what the server costs.

Writes ``benchmarks/results/servers_<part>_<model>.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TOKEN, KEY = "bench-sync-token", "bench-api-key"


def coin_reward(completions: list[str], **columns: Any) -> list[float]:
    """1 with probability 1/2 per completion (torch's generator, seeded per step by the step)."""
    return (torch.rand(len(completions)) < 0.5).float().tolist()


def _policy(model: str) -> tuple[torch.nn.Module, Any]:
    from lit_rlft.models.loading import build_policy, load_tokenizer_for

    return build_policy(model, "float32", None, None)[0].eval(), load_tokenizer_for(model)


def _server(folder: str, **kw: Any) -> Any:
    from lit_rlft.rollout.servers.launcher import VLLMServer

    return VLLMServer(folder, port=0, api_key=KEY, sync_token=TOKEN, dtype="float32", max_model_len=256,
                      kv_cache_memory_bytes=64 * 2**20, cpu_threads_bind="0", **kw).start()


def _nudge(policy: torch.nn.Module, layers: str) -> None:
    """Change the weights as an optimizer step would: every trainable weight, or the last two decoder layers'."""
    with torch.no_grad():
        names = [n for n, _ in policy.named_parameters()]
        top = sorted({int(n.split(".layers.")[1].split(".")[0]) for n in names if ".layers." in n})[-2:]
        for name, p in policy.named_parameters():
            if layers == "all" or any(f".layers.{i}." in name for i in top):
                p.add_(1e-3 * torch.randn_like(p))


def sync(a: argparse.Namespace) -> dict[str, Any]:
    from lit_rlft.models.export import hf_weights, save_hf_checkpoint
    from lit_rlft.rollout.servers.calls import call
    from lit_rlft.rollout.servers.weight_sync import WeightSync

    policy, tok = _policy(a.model)
    folder = tempfile.mkdtemp(prefix="lit_rlft_bench_servers_")
    save_hf_checkpoint(policy, folder)
    tok.save_pretrained(folder)
    kinds = ["full", "changed, every layer", "changed, top 2 layers", "changed, nothing"]
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    server = _server(folder, lora_rank=a.lora_rank)
    try:
        with WeightSync([server.url], "127.0.0.1:0", TOKEN, api_key=KEY, timeout_s=600.0) as ws:
            ws.connect()
            version = 0
            ws.sync_weights(lambda: hf_weights(policy), version, full=True)  # the run's first push (not timed)
            for _ in range(a.rounds):
                for kind in kinds:
                    version += 1
                    if kind != "changed, nothing":
                        _nudge(policy, "top" if kind == "changed, top 2 layers" else "all")
                    stats = ws.sync_weights(lambda: hf_weights(policy), version, full=kind == "full")
                    info = call(server.url, "/weight_info", timeout_s=30, action="checking", method="GET")
                    assert str(info.get("weight_version")) == str(version), info
                    rows[kind].append({"seconds": stats.seconds, "bytes": stats.bytes, "tensors": stats.tensors})
                    print(f"{kind}: {stats.seconds:.3f} s, {stats.bytes / 2**20:.1f} MiB, {stats.tensors} tensors",
                          flush=True)
            if a.lora_rank:
                rows.update(_adapter(a, ws, policy, version))
    finally:
        server.stop()
    params = sum(p.numel() for p in policy.parameters())
    return {"model": a.model, "parameters": params, "rounds": a.rounds, "rows": rows,
            "summary": {k: {"median_s": statistics.median(r["seconds"] for r in v),
                            "mib": statistics.median(r["bytes"] for r in v) / 2**20,
                            "tensors": statistics.median(r["tensors"] for r in v)} for k, v in rows.items() if v}}


def _adapter(a: argparse.Namespace, ws: Any, policy: torch.nn.Module, version: int) -> dict[str, list]:
    """The same policy with LoRA adapters: the adapters alone against the merged weights."""
    from lit_rlft.models.adapters import adapter_config_dict, adapter_weights, lora_config
    from lit_rlft.models.export import hf_weights
    from lit_rlft.models.loading import LoRAConfig, apply_lora

    peft = apply_lora(policy, LoRAConfig(r=a.lora_rank, alpha=2 * a.lora_rank))
    rows: dict[str, list] = {"adapter": [], "merged (LoRA)": []}
    for _ in range(a.rounds):
        for p in (p for n, p in peft.named_parameters() if ".lora_" in n):
            with torch.no_grad():
                p.add_(1e-3 * torch.randn_like(p))
        version += 1
        stats = ws.sync_adapter(adapter_weights(peft, torch.float32), adapter_config_dict(lora_config(peft)), version)
        rows["adapter"].append({"seconds": stats.seconds, "bytes": stats.bytes, "tensors": stats.tensors})
        version += 1
        stats = ws.sync_weights(lambda: hf_weights(peft), version, full=True)
        rows["merged (LoRA)"].append({"seconds": stats.seconds, "bytes": stats.bytes, "tensors": stats.tensors})
        print(f"adapter {rows['adapter'][-1]}, merged {rows['merged (LoRA)'][-1]}", flush=True)
    return rows


def step(a: argparse.Namespace) -> dict[str, Any]:
    from lit_rlft import (
        AsyncConfig,
        CountdownTask,
        GenerationConfig,
        GRPOConfig,
        OptimConfig,
        PromptDataModule,
        build_step,
    )
    from lit_rlft.models.export import save_hf_checkpoint
    from lit_rlft.rollout import ServerEngine
    from lit_rlft.rollout.engines.vllm import VLLMEngine
    from lit_rlft.step import TorchBackend
    from lit_rlft.step.optim import configure_adamw

    policy, tok = _policy("tiny")
    folder = tempfile.mkdtemp(prefix="lit_rlft_bench_servers_")
    save_hf_checkpoint(policy, folder)
    tok.save_pretrained(folder)
    server = _server(folder)
    setups = {"colocated vLLM, depth 0": (0, "local"), "server, depth 0": (0, "server"),
              "server, depth 1": (1, "server")}
    times: dict[str, list[float]] = {k: [] for k in setups}
    try:
        for r in range(a.rounds):
            for name, (depth, kind) in setups.items():
                engine = VLLMEngine(dtype="float32", max_model_len=256, kv_cache_memory_bytes=64 * 2**20) \
                    if kind == "local" else ServerEngine([server.url], rendezvous="127.0.0.1:0", api_key=KEY,
                                                         sync_token=TOKEN, timeout_s=600.0)
                config = GRPOConfig(model="tiny", engine=engine, reward_funcs=["benchmarks.servers.coin_reward"],
                                    generation=GenerationConfig(num_generations=a.generations,
                                                                max_completion_length=a.max_new_tokens),
                                    asynchronous=AsyncConfig(depth=depth),
                                    optim=OptimConfig(learning_rate=1e-5))
                st = build_step(config)
                data = PromptDataModule(train=CountdownTask(size=2000, split="train", seed=0), answer_field=None,
                                        batch_size=a.prompts)
                data.setup("fit")
                st.bind(data)
                opt = configure_adamw(st.policy, st.optim, total_steps=None)
                backend = TorchBackend(st.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
                ends = []
                try:
                    st.start()
                    t0 = time.perf_counter()
                    for _ in range(a.steps):
                        st.run(backend)
                        ends.append(time.perf_counter() - t0)
                finally:
                    st.close()
                steps = [b - e for e, b in zip([0.0, *ends[:-1]], ends)][a.warmup:]
                times[name] += steps
                print(f"round {r + 1} {name}: median step {statistics.median(steps):.3f} s", flush=True)
    finally:
        server.stop()
    return {"steps": a.steps, "warmup": a.warmup, "prompts": a.prompts, "generations": a.generations,
            "max_new_tokens": a.max_new_tokens, "times": times,
            "summary": {k: {"median_step_s": statistics.median(v)} for k, v in times.items()}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["sync", "step"])
    p.add_argument("--model", default="tiny", help="sync: 'tiny', 'smollm2-135m-instruct' or a folder")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lora-rank", type=int, default=None, help="sync: also push a LoRA policy's adapters")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    result = sync(a) if a.part == "sync" else step(a)
    result["command"] = "python benchmarks/servers.py " + " ".join(argv if argv is not None else sys.argv[1:])
    name = a.part if a.part == "step" else f"sync_{Path(a.model).name}"
    from lit_rlft.records.jsonio import write_result

    out = write_result(a.out or REPO / "benchmarks" / "results" / f"servers_{name}.json", result)
    print("\n| push / setup | median s | MiB | tensors |" if a.part == "sync" else "\n| setup | median step (s) |")
    print("|---|---|---|---|" if a.part == "sync" else "|---|---|")
    for k, v in result["summary"].items():
        if a.part == "sync":
            print(f"| {k} | {v['median_s']:.3f} | {v['mib']:.1f} | {v['tensors']:.0f} |")
        else:
            print(f"| {k} | {v['median_step_s']:.3f} |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
