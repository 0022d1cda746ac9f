"""The documentation site and the README as its front door: ``mkdocs build --strict`` passes (links, anchors, the API
reference); the README stays short; every section the README had lives on a page; every public name is in the API
reference; every command-bearing block is run by the suite or listed with the reason it is not."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO

PAGES = [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
COMMAND_LANGS = ("bash", "sh", "shell", "console", "python")
_BLOCK = re.compile(r"(<!-- doctest: (?P<tag>[\w-]+)[^>]*-->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)

#: The README's sections before the site (lit_rlft 0.3, 1,291 lines) and the page each lives on now.
MOVED = {
    "Set-up: two commands": "docs/getting-started.md",
    "How a step works": "docs/guides/step.md",
    "Scale out: DDP, FSDP2 + LoRA, Fabric": "docs/guides/scale-out.md",
    "vLLM and a real pretrained model": "docs/guides/vllm.md",
    "Generation servers: vLLM beyond the trainer's machine": "docs/guides/vllm.md",
    "Asynchronous rollouts: generation beside training": "docs/guides/async.md",
    "Rewards: rules, reward models, LLM judges, remote scorers": "docs/guides/rewards.md",
    "Multi-turn: tools and environments": "docs/guides/multi-turn.md",
    "Configs": "docs/guides/configs.md",
    "Reading TensorBoard": "docs/guides/configs.md",
    "Which strategy pays on my data?": "docs/guides/study.md",
    "How to read the report": "docs/guides/study.md",
    "On a real model: SmolLM2-135M-Instruct on GSM8K": "docs/results/real-models.md",
    "What SmolLM2-135M learns on GSM8K": "docs/results/real-models.md",
    "Same learning for less: time to TRL's accuracy, and when selection pays (issue 38)": "docs/results/time-to-trl.md",
    "The demo: GRPO learns Countdown on CPU": "docs/results/demo.md",
    "Step time and memory against TRL's GRPOTrainer": "docs/results/performance.md",
    "Memory and speed options (CPU)": "docs/results/performance.md",
    "Long completions at real vocabularies: chunked log-probs (issue 46)": "docs/results/performance.md",
    "A real pretrained model on CPU: SmolLM2-135M-Instruct + LoRA on GSM8K": "docs/results/real-models.md",
    "vLLM against the HF engine on this CPU": "docs/results/performance.md",
    "Selection cost (benchmarks)": "docs/results/performance.md",
    "Rollout replay at equal steps": "docs/results/countdown.md",
    "The strategy study: equal rollout budgets on Countdown": "docs/results/countdown.md",
    "Where selection was meant to pay: a skewed pool (issue 25)": "docs/results/countdown.md",
    "Package layout": "docs/design.md",
}


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    site = tmp_path / "site"
    api = (site / "api" / "callbacks" / "index.html").read_text()
    assert 'id="lit_rlft.callbacks.DPSCallback"' in api  # mkdocstrings rendered the docstrings
    assert "ReasoningGymTask" in (site / "api" / "data" / "index.html").read_text()
    home = (site / "getting-started" / "index.html").read_text()
    assert 'id="quick-start-python"' in home and "RolloutBudgetStop" in home  # the README's quick starts, included


def test_the_readme_is_a_short_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 260, len(lines)
    headings = [h for h in lines if h.startswith("## ")]
    assert headings == ["## Set-up: two commands", "## Quick start: YAML", "## Quick start: Python",
                        "## Which strategy pays on my data?", "## Results"]


@pytest.mark.parametrize("title", sorted(MOVED))
def test_every_old_readme_section_lives_on_a_page(title):
    page = (REPO / MOVED[title]).read_text()
    assert re.search(rf"^#+ {re.escape(title)}$", page, re.M), f"{title!r} is not a heading of {MOVED[title]}"


def _api_names() -> set[str]:
    text = "\n".join(p.read_text() for p in (REPO / "docs" / "api").glob("*.md"))
    return {m.rsplit(".", 1)[-1] for m in re.findall(r"^::: ([\w.]+)$", text, re.M)}


def test_every_public_name_is_in_the_api_reference():
    import lit_rlft
    import lit_rlft.records
    import lit_rlft.study

    missing = ({n for n in lit_rlft.__all__ if n != "__version__"} | set(lit_rlft.study.__all__)
               | set(lit_rlft.records.__all__)) - _api_names()
    assert not missing, f"not in docs/api/*.md: {sorted(missing)}"


def _tags_used_by_tests() -> set[str]:
    text = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py"))
    return set(re.findall(r"""_block\(["']([\w-]+)["']""", text)) | set(re.findall(r"doctest: ([\w-]+)", text))


def test_every_command_block_is_run_by_the_suite_or_listed_with_its_reason():
    listed = yaml.safe_load((REPO / "tests" / "unrun_blocks.yaml").read_text())
    assert all(e.get("reason") for e in listed), "an unrun block without its reason"
    used, matched = _tags_used_by_tests(), set()
    problems = []
    for page in PAGES:
        rel = str(page.relative_to(REPO))
        for m in _BLOCK.finditer(page.read_text()):
            if m.group("lang") not in COMMAND_LANGS:
                continue
            if m.group("tag"):
                if m.group("tag") not in used:
                    problems.append(f"{rel}: doctest {m.group('tag')!r} is run by no test")
                continue
            first = m.group("body").splitlines()[0]
            hits = [i for i, e in enumerate(listed) if e["page"] == rel and first.startswith(e["first"])]
            if not hits:
                problems.append(f"{rel}: block {first[:80]!r} is neither doctested nor in tests/unrun_blocks.yaml")
            matched.update(hits)
    stale = [f"{e['page']}: {e['first'][:60]!r}" for i, e in enumerate(listed) if i not in matched]
    assert not problems and not stale, problems + [f"stale entry {s}" for s in stale]
