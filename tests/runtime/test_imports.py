"""import_object: dotted paths to functions, classes, class attributes and modules; the errors name the path."""

from __future__ import annotations

import collections
import json
import json.decoder
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from lit_rlft.runtime.imports import import_object

PACKAGE = "lit_rlft_test_imports_pkg"


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A throw-away package on ``sys.path``: ``tool.py`` (re-exported by ``__init__``), ``broken.py`` (imports a
    dependency that is not installed) and ``raises.py`` (its code raises)."""
    root = tmp_path / PACKAGE
    root.mkdir()
    files = {
        "__init__.py": f"from {PACKAGE}.tool import tool\n",
        "tool.py": "def tool():\n    return 'tool'\n",
        "broken.py": "import lit_rlft_no_such_dependency_xyz\n\ndef fn():\n    pass\n",
        "raises.py": "raise RuntimeError('boom at import')\n",
    }
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield PACKAGE
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def test_a_function_a_class_and_an_attribute_of_a_class():
    assert import_object("json.dumps") is json.dumps
    assert import_object("collections.OrderedDict") is collections.OrderedDict
    assert import_object("collections.OrderedDict.fromkeys") == collections.OrderedDict.fromkeys
    assert import_object("json.decoder.JSONDecoder.decode") is json.decoder.JSONDecoder.decode


def test_a_module():
    assert import_object("json.decoder") is json.decoder
    assert import_object("json") is json


def test_allow_module_false_prefers_the_attribute_of_the_same_name(package: str):
    # pkg/__init__.py imports the function `tool` from the submodule pkg/tool.py: the path names both
    assert callable(import_object(f"{package}.tool", allow_module=False))
    assert import_object(f"{package}.tool", allow_module=False)() == "tool"
    assert type(import_object(f"{package}.tool")).__name__ == "module"


def test_a_missing_module_names_the_path_and_what_it_was_for():
    with pytest.raises(ValueError) as err:
        import_object("lit_rlft_no_such_module_xyz.thing", "reward function")
    assert str(err.value) == (
        "cannot resolve reward function 'lit_rlft_no_such_module_xyz.thing': no module 'lit_rlft_no_such_module_xyz'"
    )


def test_a_missing_attribute_names_the_object_that_lacks_it():
    with pytest.raises(ValueError) as err:
        import_object("json.no_such_function", "reward function")
    assert str(err.value) == "cannot resolve reward function 'json.no_such_function': 'json' has no 'no_such_function'"
    with pytest.raises(ValueError) as err:
        import_object("collections.OrderedDict.nope.deeper")
    assert str(err.value) == "cannot resolve object 'collections.OrderedDict.nope.deeper': 'OrderedDict' has no 'nope'"


def test_the_caller_chooses_the_wording():
    with pytest.raises(ValueError, match=r"^tool 'json\.nope': json lacks nope$"):
        import_object("json.nope", "tool", no_attribute="{what} {path!r}: {owner} lacks {attribute}")
    with pytest.raises(ValueError, match=r"^no lit_rlft_nope_xyz for tool 'lit_rlft_nope_xyz\.f'$"):
        import_object("lit_rlft_nope_xyz.f", "tool", no_module="no {module} for {what} {path!r}")


@pytest.mark.parametrize("path", ["", "json..dumps", ".json", "json."])
def test_a_malformed_path_is_an_error(path: str):
    with pytest.raises(ValueError, match="not a dotted import path"):
        import_object(path)


def test_a_one_part_path_needs_allow_module():
    assert import_object("json") is json
    with pytest.raises(ValueError, match="not a dotted import path"):
        import_object("json", allow_module=False)


def test_a_missing_dependency_of_an_existing_module_propagates(package: str):
    # the module exists, so trying shorter prefixes would hide the real error: it must propagate unchanged
    for path in (f"{package}.broken.fn", f"{package}.broken"):
        with pytest.raises(ModuleNotFoundError) as err:
            import_object(path)
        assert err.value.name == "lit_rlft_no_such_dependency_xyz"
    with pytest.raises(ModuleNotFoundError):
        import_object(f"{package}.broken.fn", allow_module=False)


def test_an_error_raised_by_a_module_s_code_propagates(package: str):
    with pytest.raises(RuntimeError, match="boom at import"):
        import_object(f"{package}.raises.anything")


def test_a_missing_submodule_of_an_existing_package_is_a_missing_attribute(package: str):
    with pytest.raises(ValueError) as err:
        import_object(f"{package}.no_such_submodule.fn")
    assert str(err.value) == (
        f"cannot resolve object '{package}.no_such_submodule.fn': '{package}' has no 'no_such_submodule'"
    )
