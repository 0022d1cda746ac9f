"""ReasoningGymTask: any reasoning-gym dataset by name with its own config (its difficulty settings), or a weighted
mix of several, as a pool of records with disjoint train and held-out splits.

    data:
      train:
        class_path: lit_rlft.data.ReasoningGymTask
        init_args:
          tasks:
            - {name: chain_sum, config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}, label: sum2x1}
            - {name: chain_sum, config: {min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 1}, label: sum3x1}
          size: 600
          split: train
      val:
        class_path: lit_rlft.data.ReasoningGymTask
        init_args: {tasks: [...the same...], size: 200, split: test}
      prompt_field: question
      chat_template: true
      system_prompt: "Answer with only the final answer inside <answer></answer> tags."

One dataset is ``name`` + ``config``; a mix is ``tasks``, a list of :class:`GymSpec` (name, config, weight, label).
Each instance draws its spec by weight, then the spec's next item. A fixed hash of ``(dataset name, question)``
decides the split (:func:`~lit_rlft.data.tasks.held_out`), whatever the seed or the spec: a training pool and a
held-out pool never share a question. Record fields: ``question``, ``answer`` (the gold answer), ``task`` (the
dataset's name), ``difficulty`` (the spec's label: evaluation reports ``val/accuracy/difficulty_<label>``, and
``--group`` pools labels), ``metadata`` (what the dataset generated: its scorer reads it) and ``solution`` (the gold
answer written in ``answer_format``: a warm start's target). Score with
:class:`~lit_rlft.rewards.ReasoningGymReward` (the datasets' own ``score_answer``).

reasoning-gym is an optional extra (``pip install 'lit_rlft[gym]'``). An unknown dataset name or config key fails
when the task is built, naming it and what is valid.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_rlft.data.loading import Record
from lit_rlft.data.tasks import SampledTask, Split
from lit_rlft.rewards.answer_format import AnswerFormat, check_answer_format, write_answer
from lit_rlft.rewards.reasoning_gym import GYM_EXTRA
from lit_rlft.runtime.imports import require

__all__ = ["GymSpec", "ReasoningGymTask", "gym_datasets"]


def gym_datasets() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registry: dataset name -> (dataset class, config dataclass)."""
    return require("reasoning_gym.factory", GYM_EXTRA, what="reasoning-gym tasks").DATASETS


@dataclass
class GymSpec:
    """One reasoning-gym dataset of a task (or of a mix).

    Attributes:
        name: the dataset's name in reasoning-gym (``chain_sum``, ``letter_counting``, ...).
        config: its config's keys, the difficulty settings among them (``seed`` and ``size`` are the task's).
        weight: relative share of the instances drawn from it (a mix).
        label: the ``difficulty`` value of its rows (default: the name, with ``_<i>`` when a name repeats).
    """

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    label: str | None = None


def _spec(entry: GymSpec | Mapping[str, Any], where: str) -> GymSpec:
    if isinstance(entry, GymSpec):
        return entry
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected {{name, config, weight, label}}, got {entry!r}")
    unknown = sorted(set(entry) - {f.name for f in dataclasses.fields(GymSpec)})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (valid: name, config, weight, label)")
    if "name" not in entry:
        raise ValueError(f"{where}: 'name' is missing (a reasoning-gym dataset name)")
    return GymSpec(**dict(entry))


def _check_spec(spec: GymSpec, where: str, registry: Mapping[str, tuple[type, type]]) -> Any:
    """The spec's dataset config (validated), or a ValueError naming ``where``, the name or the key."""
    if spec.name not in registry:
        import difflib

        close = difflib.get_close_matches(spec.name, list(registry), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else f" ({len(registry)} datasets: see reasoning_gym.factory.DATASETS)"
        raise ValueError(f"{where}: unknown reasoning-gym dataset {spec.name!r}{hint}")
    config_cls = registry[spec.name][1]
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    config = dict(spec.config or {})
    if "seed" in config or "size" in config:
        raise ValueError(f"{where}: set seed and size on the task (ReasoningGymTask.seed / .size), not in config")
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise ValueError(f"{where}: {spec.name} has no config key(s) {', '.join(unknown)} "
                         f"(its keys: {', '.join(fields)})")
    if not isinstance(spec.weight, (int, float)) or isinstance(spec.weight, bool) or not spec.weight >= 0 \
            or spec.weight == float("inf"):
        raise ValueError(f"{where}: weight must be a finite number >= 0, got {spec.weight!r}")
    try:
        made = config_cls(**config)
        if hasattr(made, "validate"):
            made.validate()
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: {spec.name} refuses config {config}: {e or type(e).__name__}") from None
    return made


class ReasoningGymTask(SampledTask):
    """reasoning-gym datasets as records (see the module docstring).

    Args:
        name: one dataset's name (with ``config``); or give ``tasks``.
        config: that dataset's config keys (difficulty settings).
        tasks: a mix: :class:`GymSpec` entries (or mappings with ``name``, ``config``, ``weight``, ``label``).
        size: number of instances.
        split: ``"train"`` (not held out), ``"test"`` (held out) or ``"all"``.
        held_out_fraction: fraction of ``(name, question)`` keys held out, by a fixed hash.
        seed: random seed: the same arguments give the same records.
        unique: keep only the first instance of each question (per dataset).
        answer_format: how ``solution`` states the gold answer (the reward's ``answer_format``).
    """

    def __init__(
        self,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        tasks: list[GymSpec] | None = None,
        size: int = 1000,
        split: Split = "train",
        held_out_fraction: float = 0.2,
        seed: int = 0,
        unique: bool = False,
        answer_format: AnswerFormat = "answer_tags",
    ) -> None:
        super().__init__(size, split, held_out_fraction, seed, unique)
        if (name is None) == (tasks is None):
            raise ValueError("ReasoningGymTask: give either name (with config) or tasks (a mix), not "
                             + ("both" if name is not None else "neither"))
        if tasks is not None and config is not None:
            raise ValueError("ReasoningGymTask: config belongs to name; in a mix, give each entry of tasks its config")
        entries: Sequence[Any] = [GymSpec(name, dict(config or {}))] if name is not None else list(tasks or [])
        if not entries:
            raise ValueError("ReasoningGymTask: tasks is empty; give at least one {name, config}")
        registry = gym_datasets()
        self.tasks: list[GymSpec] = []
        self._configs: list[Any] = []
        for i, entry in enumerate(entries):
            where = "ReasoningGymTask" if name is not None else f"ReasoningGymTask.tasks[{i}]"
            spec = _spec(entry, where)
            self._configs.append(_check_spec(spec, where, registry))
            self.tasks.append(spec)
        if sum(s.weight for s in self.tasks) <= 0:
            raise ValueError("ReasoningGymTask: the tasks' weights sum to 0; give at least one a positive weight")
        names = [s.name for s in self.tasks]
        self.labels = [s.label if s.label is not None else (s.name if names.count(s.name) == 1 else f"{s.name}_{i}")
                       for i, s in enumerate(self.tasks)]
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"ReasoningGymTask: two tasks share a label ({self.labels}); give each a distinct label")
        self.answer_format = check_answer_format(answer_format, "ReasoningGymTask.answer_format")

    def _dataset(self, i: int) -> Any:
        """Spec ``i``'s reasoning-gym dataset, seeded from ``(seed, i)`` (the same for every split: the hash splits)."""
        cls = gym_datasets()[self.tasks[i].name][0]
        config = dataclasses.replace(self._configs[i])
        config.seed = random.Random(f"{self.seed}:{i}").getrandbits(31)
        config.size = self.size  # nominal: items are made by index, and the sampler may read past it
        return cls(config=config)

    def records(self) -> list[Record]:
        """Generate the instances (deterministic for the arguments)."""
        rng = random.Random(self.seed)
        datasets = [self._dataset(i) for i in range(len(self.tasks))]
        cursor = [0] * len(self.tasks)
        weights = [s.weight for s in self.tasks]

        def draw(i: int) -> tuple[str, tuple[int, dict[str, Any]]]:
            entry = datasets[i][cursor[i]]  # items are generated from (dataset seed, index): any index works
            cursor[i] += 1
            return f"{self.tasks[i].name}|{entry['question']}", (i, entry)

        def describe(i: int) -> str:
            return (f"{self.tasks[i].name} with config {self.tasks[i].config}, split={self.split!r}, "
                    f"unique={self.unique}: lower size, widen the config's ranges, or set unique=False")

        def stratum() -> int:
            return rng.choices(range(len(self.tasks)), weights=weights)[0]

        out = []
        for k, (i, entry) in enumerate(self.sample(draw, describe, stratum)):
            answer = str(entry["answer"])
            out.append(Record({"question": str(entry["question"]), "answer": answer, "task": self.tasks[i].name,
                               "difficulty": self.labels[i], "metadata": dict(entry.get("metadata") or {}),
                               "solution": write_answer(answer, self.answer_format)},
                              f"generated:reasoning_gym/{self.labels[i]}#{k}"))
        return out
