"""``import lit_rlft`` imports no Lightning (nor do the rollout, step, reward and data packages that worker and server
processes import); a top-level name imports its module on first use and is the object that module defines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _imported(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_lit_rlft_and_the_worker_side_packages_import_no_lightning():
    seen = _imported(
        "import json, sys\n"
        "import lit_rlft\n"
        "top = 'lightning' in sys.modules or 'torch' in sys.modules\n"
        "import lit_rlft.rollout, lit_rlft.rollout.worker, lit_rlft.step, lit_rlft.rewards, lit_rlft.data, lit_rlft.envs\n"
        "worker_side = 'lightning' in sys.modules\n"
        "module = lit_rlft.GRPOModule\n"
        "print(json.dumps([top, worker_side, 'lightning' in sys.modules, module.__module__]))")
    assert seen == [False, False, True, "lit_rlft.lightning.module"]


def test_every_top_level_name_resolves_to_its_module_s_object():
    import importlib

    import lit_rlft

    for name in lit_rlft.__all__:
        if name == "__version__":
            continue
        value = getattr(lit_rlft, name)
        assert value is getattr(importlib.import_module(lit_rlft._EXPORTS[name]), name), name
    assert set(lit_rlft.__all__) - {"__version__"} == set(lit_rlft._EXPORTS)
    assert set(lit_rlft.__all__) <= set(dir(lit_rlft))
    with pytest.raises(AttributeError, match="no attribute 'GRPOTrainer'"):
        lit_rlft.GRPOTrainer  # noqa: B018
    from lit_rlft.data import PromptDataModule
    from lit_rlft.data.datamodule import PromptDataModule as defined

    assert PromptDataModule is defined


def test_the_static_imports_are_the_exports():
    """The ``TYPE_CHECKING`` imports that IDEs read name the same objects, from the same modules, as ``_EXPORTS``
    (the one list ``__all__`` is made of): a name added to one and not the other fails here."""
    import ast

    import lit_rlft

    tree = ast.parse((REPO / "lit_rlft" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    static = {alias.name: node.module for node in ast.walk(block) if isinstance(node, ast.ImportFrom)
              for alias in node.names}
    assert static == lit_rlft._EXPORTS
    assert sorted(lit_rlft.__all__) == sorted(["__version__", *lit_rlft._EXPORTS])
