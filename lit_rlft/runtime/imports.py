"""Import an object named by a dotted path (``"package.module.Class.method"``), as YAML configs name them.

:func:`import_object` imports the longest prefix of the path that is a module and walks the rest as attributes. A
prefix that does not exist means "try a shorter one"; a module that exists but fails to import (a missing
dependency, an error in its code) is a real error, and its exception propagates unchanged.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["NO_ATTRIBUTE", "NO_MODULE", "MissingExtra", "import_object", "require"]

NO_MODULE = "cannot resolve {what} {path!r}: no module {module!r}"
"""Default message when no prefix of the path is a module; ``module`` is the path's first part."""

NO_ATTRIBUTE = "cannot resolve {what} {path!r}: {owner!r} has no {attribute!r}"
"""Default message when the walk stops; ``owner`` is the ``__name__`` of the object that lacks ``attribute``."""

_MISSING = object()


def import_object(
    path: str,
    what: str = "object",
    *,
    allow_module: bool = True,
    no_module: str = NO_MODULE,
    no_attribute: str = NO_ATTRIBUTE,
) -> Any:
    """The object that the dotted ``path`` names: a module, or an attribute (at any depth) of a module.

    The longest prefix of ``path`` that imports is the module; the remaining parts are attributes, looked up in
    turn (``"collections.OrderedDict.fromkeys"`` imports ``collections``, then walks ``OrderedDict`` and
    ``fromkeys``). A prefix whose import fails because that very module does not exist is skipped for a shorter
    one; any other failure of an import (``ModuleNotFoundError`` for a dependency that an existing module imports,
    ``SyntaxError``, an exception raised by the module's code) propagates unchanged.

    >>> import_object("json.dumps").__name__
    'dumps'
    >>> import_object("json.nope", "reward function")
    Traceback (most recent call last):
    ...
    ValueError: cannot resolve reward function 'json.nope': 'json' has no 'nope'

    Args:
        path: The dotted path, e.g. ``"lit_rlft.rewards.math_reward"``.
        what: What the path is for, named in the error messages (``"reward function"``, ``"tool"``).
        allow_module: Whether the whole path may name a module. When False, the last part is always an
            attribute: ``"pkg.tool"`` gives the function ``tool`` that ``pkg/__init__.py`` imports from its
            submodule ``pkg/tool.py``, not that submodule (and a one-part path is malformed).
        no_module: Message when no prefix imports; ``str.format`` fields ``what``, ``path`` and ``module`` (the
            path's first part).
        no_attribute: Message when an attribute is missing; fields ``what``, ``path``, ``owner`` (the ``__name__``
            of the object walked so far, or its type's name) and ``attribute`` (the missing part).

    Raises:
        ValueError: the path is malformed (an empty part), no prefix of it is a module, or an attribute is missing.
    """
    parts = path.split(".")
    if not all(parts) or (not allow_module and len(parts) < 2):
        raise ValueError(f"cannot resolve {what} {path!r}: not a dotted import path like 'package.module.name'")
    longest = len(parts) if allow_module else len(parts) - 1
    for cut in range(longest, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this prefix does not exist" means "try a shorter one": the missing module is the prefix or one
            # of its parents. A dependency missing inside an existing module is a real error.
            if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue
            raise
        for attribute in parts[cut:]:
            value = getattr(obj, attribute, _MISSING)
            if value is _MISSING:
                owner = getattr(obj, "__name__", None) or type(obj).__name__
                raise ValueError(no_attribute.format(what=what, path=path, owner=owner, attribute=attribute))
            obj = value
        return obj
    raise ValueError(no_module.format(what=what, path=path, module=parts[0]))


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra installs it."""


def require(module: str, install: str, what: str) -> Any:
    """``importlib.import_module(module)``, or :class:`MissingExtra` saying that ``what`` needs it and how to install
    it (``install``, e.g. ``"pip install 'lit_rlft[gym]'"``), when the module's top-level package is missing.

    >>> require("no_such_package_here.x", "pip install 'lit_rlft[gym]'", "reasoning-gym tasks")
    Traceback (most recent call last):
    ...
    lit_rlft.runtime.imports.MissingExtra: reasoning-gym tasks need the package 'no_such_package_here', which is not installed: pip install 'lit_rlft[gym]'
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name is not None and (exc.name == top or module.startswith(exc.name + ".")):
            raise MissingExtra(f"{what} need the package {top!r}, which is not installed: {install}") from None
        raise
