"""ServerEngine: generation on vLLM servers (``lit-rlft serve``), on this machine or others, several at once.

    model:
      engine:
        class_path: lit_rlft.rollout.ServerEngine
        init_args: {urls: ["10.0.0.5:8000", "10.0.0.6:8000"], rendezvous: "10.0.0.2:29600"}
    # secrets from the environment: LIT_RLFT_SYNC_TOKEN (required), LIT_RLFT_API_KEY (vLLM's --api-key, optional)

Each ``generate`` call sends whole groups: one request per prompt (its token ids, ``n = G``, the prompt's seed, the
sampling settings, the sampled tokens' log-probs asked for) to vLLM's token-in endpoint ``/inference/v1/generate``,
the prompts split over the live servers (rank ``r``'s prompt ``i`` to server ``(i + r) mod S``); it gets back token ids, log-probs, finish
reasons and the weights version each completion was sampled from. Prompt ``i`` is seeded ``seed + i * G`` as the
colocated :class:`~lit_rlft.rollout.engines.vllm.VLLMEngine` seeds it, so the same seeds give the same completions on one
server, on several, and in process.

Weights reach the servers through one ``torch.distributed`` group (gloo on CPU, NCCL on GPU) that the trainer's rank
0 forms with every server's worker at ``rendezvous`` (:mod:`lit_rlft.rollout.servers.weight_sync`): :meth:`sync_weights` drains the
servers, sends the weights (all of them, or only the tensors whose bytes changed, in buckets) with a version, and
resumes them. Every rank calls it (an FSDP2 shard is gathered); rank 0 sends. LoRA policies send merged weights, or
(``lora_sync: adapter``) only their adapters, which the servers load as a vLLM LoRA adapter.

Failures: a server that refuses, drops, times out or answers something that is not a completion (or one sampled from
other weights than the last pushed: a restarted server) is named (host:port, what was asked). With several servers
its unanswered prompts go to the others (the same seeds: the same rows) and it is dropped (``servers/dropped``, a
warning); with one, the call fails with the cause. At every push a dropped server that answers ``/health`` again is
taken back: the group is formed anew with it and every server gets the full weights.

Notation: ``B`` prompts, ``G`` completions per prompt, ``N = B * G``, ``S`` servers.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import torch
from torch import nn

from lit_rlft.core.types import pad_to
from lit_rlft.models.export import hf_weights
from lit_rlft.models.sharding import hf_model, is_sharded
from lit_rlft.rollout.engines.base import FinishReason, GenerationOutput, RolloutEngine, SamplingConfig, stop_token_ids
from lit_rlft.rollout.servers.calls import ServerCallError, call
from lit_rlft.rollout.servers.roster import Server, ServerError, ServerRoster, server_url
from lit_rlft.rollout.servers.weight_sync import LORA_NAME, WeightSync, WeightSyncError
from lit_rlft.runtime.distributed import LocalCollective, Ranks

__all__ = ["ServerEngine", "ServerError"]

TOKEN_ENV = "LIT_RLFT_SYNC_TOKEN"
API_KEY_ENV = "LIT_RLFT_API_KEY"


class _Failed(Exception):
    """One request failed; ``server_fault``: the server is to blame (it is dropped), else the request itself."""

    def __init__(self, message: str, server_fault: bool = True):
        super().__init__(message)
        self.server_fault = server_fault


class ServerEngine(RolloutEngine):
    """Sample on vLLM servers and push weights to them (see the module docstring).

    Args:
        urls: the servers, ``host:port`` (or ``http://host:port``), each started with ``lit-rlft serve``.
        rendezvous: ``host:port`` where the trainer's rank 0 listens for the servers' workers to join the weight-sync
            group: an address of this machine that the servers can reach (a port nothing else uses).
        api_key: vLLM's ``--api-key`` of the servers (None: ``$LIT_RLFT_API_KEY`` or ``$VLLM_API_KEY``, or no key).
        sync_token: the servers' weight-sync token (None: ``$LIT_RLFT_SYNC_TOKEN``); a server refuses a group or a push
            without it. Prefer the environment: a config file is saved with the run.
        backend: the weight-sync group's ``torch.distributed`` backend: ``auto`` (NCCL for a policy on a GPU, else
            gloo), ``gloo`` or ``nccl``.
        timeout_s: bound on one request, one weight push and forming the group: past it the server is named.
        changed_only: push only the tensors whose bytes changed since the last push (whole decoder layers); the first
            push, a push after a checkpoint was loaded and one that takes a server back send everything. It pays when
            whole layers do not train (frozen layers: SmolLM2-135M with its top 2 layers training, 0.95 s against 3.2 s
            per push here); after full fine-tuning or a merged LoRA every layer changed and the digests only add their
            pass (about 1 s per push for SmolLM2 on this CPU), hence off by default.
        bucket_mib: the broadcast's bucket, in MiB (the extra memory of a push on each side, besides the servers'
            staged copy).
        lora_sync: how a peft LoRA policy reaches the servers: ``merged`` (full weights, the adapters merged) or
            ``adapter`` (only the adapters, loaded by vLLM as a LoRA adapter: start the servers with ``--lora-rank``).
        max_concurrency: requests in flight per server.
        start_timeout_s: before the first push, how long to wait for the servers to answer ``/health`` (servers
            started beside the trainer load their model meanwhile); one that does not answer by then is dropped.
    """

    def __init__(self, urls: list[str], rendezvous: str = "127.0.0.1:29600", api_key: str | None = None,
                 sync_token: str | None = None, backend: Literal["auto", "gloo", "nccl"] = "auto",
                 timeout_s: float = 300.0, changed_only: bool = False, bucket_mib: int = 64,
                 lora_sync: Literal["merged", "adapter"] = "merged", max_concurrency: int = 16,
                 start_timeout_s: float = 600.0):
        if not urls:
            raise ValueError("ServerEngine: urls is empty: give the servers as host:port (started with lit-rlft serve)")
        if timeout_s <= 0 or bucket_mib < 1 or max_concurrency < 1:
            raise ValueError(f"ServerEngine: timeout_s must be > 0, bucket_mib and max_concurrency >= 1; got "
                             f"{timeout_s}, {bucket_mib}, {max_concurrency}")
        if backend not in ("auto", "gloo", "nccl") or lora_sync not in ("merged", "adapter"):
            raise ValueError(f"ServerEngine: backend is auto | gloo | nccl and lora_sync merged | adapter; got "
                             f"{backend!r}, {lora_sync!r}")
        self.roster = ServerRoster(urls, timeout_s)  # which servers serve (health, drops, take-back)
        server_url(rendezvous)  # checked: host:port
        self.rendezvous, self.backend, self.timeout_s = rendezvous, backend, float(timeout_s)
        self.api_key, self.sync_token = api_key, sync_token
        self.changed_only, self.bucket_mib, self.lora_sync = changed_only, bucket_mib, lora_sync
        self.max_concurrency, self.start_timeout_s = max_concurrency, float(start_timeout_s)
        self.version = -1  # the weights version the servers hold (none pushed yet)
        self.last_sync_bytes = None
        self.last_sync_s = 0.0
        self.stop_ids: list[int] = []
        self.pad_token_id = 0
        self.lora_name: str | None = None  # the adapter's name requests ask for (adapter sync)
        self.doing = "generating"  # what the caller is doing, for failures (the rollout source sets it)
        #: the trainer's ranks (the rollout source gives the step's): rank 0 sends the weights; each rank's prompts
        #: start on a different server
        self.ranks: Ranks = LocalCollective()
        self._sync: Any = None  # the WeightSync, formed at the first push
        self._members: list[str] = []  # the servers in the current group
        self._threads: ThreadPoolExecutor | None = None
        self._lora: Any = None
        self._device = torch.device("cpu")

    # -- set-up ------------------------------------------------------------------------------------------------
    def setup(self, model: nn.Module, tokenizer: Any, sharded: bool = False) -> None:
        """The pad and stop ids (the servers hold the weights); with ``lora_sync: adapter``, the adapter checked."""
        from lit_rlft.models.adapters import check_adapter_sync, lora_config

        self.pad_token_id = tokenizer.pad_token_id
        self.stop_ids = stop_token_ids(hf_model(model), tokenizer)
        self._device = next(model.parameters()).device
        self._lora = lora_config(model) if self.lora_sync == "adapter" else None
        if self._lora is not None:
            check_adapter_sync(model, self._lora)

    @property
    def token(self) -> str:
        """The weight-sync token, from the arguments or ``$LIT_RLFT_SYNC_TOKEN``."""
        token = self.sync_token or os.environ.get(TOKEN_ENV, "")
        if not token:
            raise ServerError(f"ServerEngine: no weight-sync token: set {TOKEN_ENV} (the value the servers were started "
                              "with, lit-rlft serve --sync-token or the same variable)")
        return token

    @property
    def key(self) -> str | None:
        """vLLM's API key of the servers, from the arguments, ``$LIT_RLFT_API_KEY`` or ``$VLLM_API_KEY`` (the variable
        ``lit-rlft serve`` reads; None: none)."""
        return self.api_key or os.environ.get(API_KEY_ENV) or os.environ.get("VLLM_API_KEY") or None

    # -- generation --------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], num_generations: int, sampling: SamplingConfig,
                 seed: int | None = None) -> GenerationOutput:
        """``G`` completions of each prompt, whole groups split over the live servers (see the module docstring)."""
        G = num_generations
        bodies = [self._body(p, G, sampling, None if seed is None else (seed + i * G) % 2**31)
                  for i, p in enumerate(prompts)]
        answers: list[list[dict[str, Any]] | None] = [None] * len(prompts)
        todo = list(range(len(prompts)))
        while todo:
            live = self.roster.live(self.doing)
            rank = self.ranks.rank
            assigned = [(i, live[(i + rank) % len(live)]) for i in todo]  # ranks start on different servers
            results = self._map(lambda job: self._ask(job[1], bodies[job[0]], job[0], G), assigned)
            todo = []
            for (i, server), result in zip(assigned, results):
                if isinstance(result, _Failed):
                    if not result.server_fault:
                        raise ServerError(str(result)) from None
                    self.roster.drop(server, str(result), [s for s in live if s.alive])
                    todo.append(i)
                else:
                    answers[i] = result
        return self._output([c for a in answers for c in a])

    def _body(self, prompt: list[int], G: int, sampling: SamplingConfig, seed: int | None) -> dict[str, Any]:
        params = {"n": G, "max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                  "top_p": sampling.top_p, "top_k": sampling.top_k or -1, "logprobs": 0,
                  "stop_token_ids": self.stop_ids, "detokenize": False}
        if seed is not None:
            params["seed"] = seed
        body: dict[str, Any] = {"token_ids": [int(t) for t in prompt], "sampling_params": params}
        if self.lora_name is not None:
            body["model"] = self.lora_name
        return body

    def _ask(self, server: Server, body: dict[str, Any], index: int, G: int) -> list[dict[str, Any]] | _Failed:
        """Prompt ``index``'s ``G`` completions from ``server``: ``[{tokens, logprobs, finish, version}]``, or why not."""
        action = f"{self.doing} (prompt {index}, {G} completions)"
        try:
            answer = call(server.url, "/inference/v1/generate", body, timeout_s=self.timeout_s, action=action,
                          api_key=self.key)
        except ServerCallError as failed:
            if failed.kind == "refused" and "HTTP 401" in str(failed):
                return _Failed(f"{failed} (the API key was refused: set {API_KEY_ENV} to the servers' --api-key)",
                               server_fault=False)
            # another refusal (4xx) is the request's fault (a prompt too long, a bad setting); 5xx the server's
            return _Failed(str(failed), server_fault=failed.kind != "refused" or "HTTP 5" in str(failed))
        what = f"{server.name} while {action}"
        try:
            choices = sorted(answer["choices"], key=lambda c: c["index"])
            if len(choices) != G:
                raise ValueError(f"{len(choices)} completions for n={G}")
            out = [self._completion(c) for c in choices]
        except (KeyError, TypeError, ValueError) as exc:
            return _Failed(f"{what}: the answer is not {G} completions ({type(exc).__name__}: {exc}): "
                           f"{json.dumps(answer)[:200]}")
        stale = [c["version"] for c in out if c["version"] != self.version]
        if stale:
            return _Failed(f"{what}: sampled from weights version {stale[0]}, not the version pushed last "
                           f"({self.version}): was it restarted?")
        return out

    def _completion(self, choice: dict[str, Any]) -> dict[str, Any]:
        tokens = [int(t) for t in choice["token_ids"]]
        logprobs = [float(e["logprob"]) for e in choice["logprobs"]["content"]]
        if len(logprobs) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {len(logprobs)} log-probs")
        finish = choice["finish_reason"]
        if finish not in ("stop", "length"):
            raise ValueError(f"finish reason {finish!r}")
        versions = {str(span["version"]) for span in choice.get("weight_versions") or []}
        if len(versions) > 1:
            raise ValueError(f"sampled from several weights versions {sorted(versions)}")
        return {"tokens": tokens, "logprobs": logprobs, "finish": finish,
                "version": _version(versions.pop()) if versions else self.version}

    def _output(self, completions: list[dict[str, Any]]) -> GenerationOutput:
        length = max(1, max(len(c["tokens"]) for c in completions))
        ids = torch.stack([pad_to(torch.tensor(c["tokens"], dtype=torch.long), length, self.pad_token_id)
                           for c in completions])  # [N, L]
        mask = torch.stack([pad_to(torch.ones(len(c["tokens"]), dtype=torch.long), length, 0)
                            for c in completions])  # [N, L]
        logprobs = torch.stack([pad_to(torch.tensor(c["logprobs"], dtype=torch.float32), length, 0.0)
                                for c in completions])  # [N, L]
        reasons: list[FinishReason] = [c["finish"] for c in completions]
        return GenerationOutput(ids, mask, logprobs, reasons, versions=[c["version"] for c in completions])

    def _map(self, fn: Any, items: list[Any]) -> list[Any]:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=self.max_concurrency * len(self.roster.servers),
                                               thread_name_prefix="lit_rlft-servers")
        return list(self._threads.map(fn, items))

    # -- weights -------------------------------------------------------------------------------------------------
    def sync_weights(self, policy: nn.Module, version: int | None = None, full: bool = False) -> None:
        """Make the servers sample from ``policy``'s current weights, ``version`` (None: the next after the servers'
        one; the rollout source gives the step's): a collective over the trainer's ranks (every rank gathers its
        FSDP2 shards; rank 0 sends). Servers that were dropped and answer again are taken back (the group formed
        anew, everything sent); a server that fails during the push is dropped and the others get everything again;
        with none left, :class:`ServerError`."""
        from lit_rlft.models.adapters import adapter_weights

        version = self.version + 1 if version is None else version

        rank0 = self.ranks.rank == 0
        if self._lora is not None:
            tensors: Any = adapter_weights(policy, next(policy.parameters()).dtype)  # every rank gathers
        else:
            tensors = hf_weights(policy)
        if not rank0:
            for _ in tensors if self._lora is None else ():
                pass  # the gathers are collectives: every rank takes part; rank 0 alone sends
            self.version = version  # what the servers hold once rank 0 is done (the rollout source's barrier)
            if self._lora is not None:
                self.lora_name = LORA_NAME
            return
        # what a retry re-sends after a server failed: a sharded policy's gathered tensors are kept on rank 0 (its
        # gathers were collectives, made once); a plain policy's are read again (one tensor held at a time)
        named: Any = dict(tensors) if self._lora is not None or is_sharded(policy) else (lambda: hf_weights(policy))
        if self._sync is None:
            _ = self.token  # a missing token is said before anything waits for the servers
        if self.version == -1:
            self.roster.wait_until_healthy(self.start_timeout_s)
        self.roster.take_back()
        while True:
            live = self.roster.live(self.doing, f"no generation server is left to push weights version {version} to")
            try:
                self._send(named, version, full, live)
                return
            except WeightSyncError as exc:  # it names the server to blame: drop it, form the group anew
                self._members = []  # a failed push drops the group
                failed = next((s for s in live if s.name == exc.server), None)
                if failed is None or len(live) == 1:
                    raise ServerError(f"pushing weights version {version} to {', '.join(s.name for s in live)} "
                                      f"failed: {exc}") from exc
                self.roster.drop(failed, f"{failed.name} while pushing weights version {version}: {exc}", live)
                full = True

    def _send(self, named: Any, version: int, full: bool, live: list[Server]) -> None:
        urls = [s.url for s in live]
        if self._sync is None:
            token = self.token  # first: a missing token is said before anything is opened
            backend = self.backend
            if backend == "auto":
                backend = "nccl" if self._device.type == "cuda" else "gloo"
            self._sync = WeightSync(urls, self.rendezvous, token, api_key=self.key, backend=backend,
                                    timeout_s=self.timeout_s, bucket_bytes=self.bucket_mib * 2**20,
                                    changed_only=self.changed_only)
        if urls != self._members or not self._sync.connected:  # a failed push drops the group
            self._sync.connect(urls)
            self._members, full = urls, True
        if self._lora is not None:
            from lit_rlft.models.adapters import adapter_config_dict

            stats = self._sync.sync_adapter(named, adapter_config_dict(self._lora), version)
            self.lora_name = LORA_NAME
        else:
            stats = self._sync.sync_weights(named if callable(named) else list(named.items()), version, full=full)
        self.version = version
        self.last_sync_bytes, self.last_sync_s = stats.bytes, stats.seconds

    def metrics(self) -> dict[str, float]:
        """``servers/alive``, ``servers/dropped`` (since the start)."""
        return self.roster.metrics()

    def close(self) -> None:
        """Leave the weight-sync group and stop the request threads (the servers keep running)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        if self._sync is not None:
            self._sync.close()  # the next push forms the group anew (connect) and sends everything
        self._members = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_threads=None, _sync=None, _members=[])
        return state


def _version(label: str) -> int:
    """A server's weights version label as a number (-2: not one lit_rlft pushed, e.g. ``default`` after a restart)."""
    return int(label) if label.lstrip("-").isdigit() else -2
