"""One-line command-line errors: jsonargparse's nested type-union reports and constructor exceptions, condensed.

jsonargparse reports a bad ``class_path`` / ``init_args`` value (a callback, the engine, a task, a logger) as a dump
of every type the option accepts and why each one failed. :func:`condense_parser_error` keeps the part about the
class the user named::

    trainer.callbacks (lit_rlft.callbacks.DPSCallback): unknown option 'bogus'; valid options: decay, prior, ...
    model.num_generations: expected int, got 'four'

:func:`describe_constructor_error` does the same for an exception raised by a class's ``__init__`` while the CLI
instantiates the config (``model (lit_rlft.lightning.module.GRPOModule): num_generations must be >= 2 ...``).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import textwrap
from typing import Any

from lit_rlft.step.config import moved_key_message

__all__ = ["condense_parser_error", "describe_constructor_error"]

_KEY = re.compile(r'^Parser key "(?P<key>[^"]+)":$')
_CLASS = re.compile(r"^- Problem with given class_path '(?P<cls>[^']+)':$")
_OPTION = re.compile(r"^Option '(?P<opt>[^']+)' is not accepted")
_EXPECTED = re.compile(r"^Expected a (?P<type>.+?)\. Got value: (?P<value>.*)$")
_CLASS_REPR = re.compile(r"<class '(?:builtins\.)?(?P<name>[\w.]+)'>")
_LITERAL = re.compile(r"^typing\.Literal\[(?P<choices>.*)\]$")
_UNION_NOISE = ("Does not validate against", "Subtypes:", "Errors:", "Given value", "Not a valid subclass",
                "Subclass types expect")
_SCOPE_OPTION = re.compile(r"(?P<kind>Group|Subcommand) '(?P<scope>[^']+)' does not accept option '(?P<opt>[^']+)'")
_UNKNOWN_IN_GROUP = re.compile(r"^unknown option '(\w+)'")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: --(?P<opt>[\w.-]+)")


def condense_parser_error(message: str, prog: str = "lit-rlft", options: list[str] | None = None) -> str:
    """One line for a jsonargparse error ``message``: ``<key> (<class>): <reason>``.

    One-line messages are kept; for an unknown option they get the closest of ``options`` (the parser's option
    names, such as ``model.num_generations``) and a pointer to ``<prog> --help``.
    """
    lines = [line.rstrip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return message.strip()
    if len(lines) == 1:
        return _unknown_option(lines[0].strip(), prog, options or [])
    key = _KEY.match(lines[0].strip())
    cls, detail = _reason(_block(lines, 0) if key else lines)
    where = key["key"] if key else ""
    unknown = _UNKNOWN_IN_GROUP.match(detail)
    if unknown and where.startswith("model.") and (moved := moved_key_message(f"{where[len('model.'):]}.{unknown[1]}")):
        return moved  # a key of a nested config that moved to another group
    if cls:
        where = f"{where} ({cls})" if where else cls
    return f"{where}: {detail}" if where else detail


def _unknown_option(text: str, prog: str, options: list[str]) -> str:
    """``text`` with a did-you-mean and the help pointer when it is about an unknown option."""
    if match := _SCOPE_OPTION.search(text):
        option = f"{match['scope']}.{match['opt']}" if match["kind"] == "Group" else match["opt"]
        show = "'{}'"
    elif match := _UNRECOGNIZED.search(text):
        option, show = match["opt"], "--{}"
    else:
        return text
    group, _, wrong = option.rpartition(".")
    if option.startswith("model.") and (moved := moved_key_message(option[len("model."):])):
        return moved  # a key of lit_rlft 0.2 or 0.3 that now sits in another config group
    prefix = f"{group}." if group else ""
    names = sorted({o[len(prefix) :].split(".")[0] for o in options if o.startswith(prefix)})
    close = difflib.get_close_matches(wrong, names, n=1)
    guess = f": did you mean {show.format(prefix + close[0])}?" if close else ""
    return f"{text}{guess} (see `{prog} --help`)"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block(lines: list[str], i: int) -> list[str]:
    """The lines after ``lines[i]`` that are indented deeper than it, dedented."""
    out = []
    for line in lines[i + 1 :]:
        if _indent(line) <= _indent(lines[i]):
            break
        out.append(line)
    return textwrap.dedent("\n".join(out)).splitlines()


def _reason(lines: list[str]) -> tuple[str | None, str]:
    """``(class path or None, reason)`` for a block of a jsonargparse message."""
    for i, line in enumerate(lines):
        match = _CLASS.match(line.strip())
        if match:
            _, detail = _reason(_block(lines, i))
            return match["cls"], _with_valid_options(match["cls"], detail)
    first = lines[0].strip() if lines else ""
    if match := _KEY.match(first):
        cls, detail = _reason(_block(lines, 0))
        return cls, f"option '{match['key']}': {detail}"
    if match := _OPTION.match(first):
        return None, f"unknown option '{match['opt']}'"
    if match := _EXPECTED.match(first):
        return None, f"expected {_type_name(match['type'])}, got {match['value']!r}"
    for line in lines:
        text = line.strip().lstrip("- ").strip()
        if text and not text.startswith(_UNION_NOISE):
            return None, text
    return None, first


def _type_name(text: str) -> str:
    """``<class 'int'>`` -> ``int``; ``typing.Literal['a', 'b']`` -> ``one of 'a', 'b'``."""
    if match := _LITERAL.match(text):
        return f"one of {match['choices']}"
    return _CLASS_REPR.sub(lambda m: m["name"], text)


def _with_valid_options(class_path: str, detail: str) -> str:
    """Append the class's ``__init__`` options (and the closest one) to an unknown-option reason."""
    match = re.match(r"unknown option '(?P<opt>[^'.]+)'$", detail)
    options = _init_options(class_path) if match else []
    if not options:
        return detail
    close = difflib.get_close_matches(match["opt"], options, n=1)
    guess = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{detail}{guess}; valid options: {', '.join(options)}"


def _init_options(class_path: str) -> list[str]:
    """The keyword arguments ``class_path``'s constructor takes (empty when it cannot be imported)."""
    module, _, name = class_path.rpartition(".")
    try:
        params = inspect.signature(getattr(importlib.import_module(module), name)).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def describe_constructor_error(error: BaseException, config: Any = None) -> str:
    """One line for an exception raised while instantiating the config: the section and class whose ``__init__``
    raised it (followed through jsonargparse's re-raising), then the original message's first line. ``config``
    (the parsed config, as a dict or a jsonargparse namespace) lets a union member's error name its key."""
    chain = [error]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    root = chain[-1]
    if str(root).startswith("Expected a "):  # a union (``str | Task``) tried its first member last: the one meant
        for e in chain:
            reason = _union_reason(str(e), config)
            if reason is not None:
                return reason
    text = str(root).strip().splitlines()
    message = text[0] if text else type(root).__name__
    cls = _raising_class(root)
    if cls is None or message.startswith(("model.", "data.", "trainer.")):
        return message  # no class to name, or the message names its option already
    path, section = f"{cls.__module__}.{cls.__qualname__}", _section(cls)
    return f"{section} ({path}): {message}" if section else f"{path}: {message}"


def _union_reason(message: str, config: Any = None) -> str | None:
    """The error of the union member a value was meant for, from jsonargparse's "Does not validate against any of the
    Union subtypes" dump: the first listed error that is not a plain type mismatch (``Expected a <class 'str'>``),
    prefixed with the key of ``config`` that holds the given ``class_path`` (or its section) and the class."""
    if "Does not validate against any of the Union subtypes" not in message:
        return None
    items = [line.strip()[2:] for line in message.splitlines() if line.strip().startswith("- ")]
    meant = [i for i in items if not i.startswith(("Expected a ", "Not a valid subclass"))]
    if not meant:
        return None
    found = re.search(r"class_path='([\w.]+)'", message)
    if not found:
        return meant[0]
    path = found.group(1)
    reason = meant[0]
    short = path.rpartition(".")[2]
    if reason.startswith(f"{short}: "):
        reason = reason[len(short) + 2:]  # the class names itself: say it once
    where = _key_of_class_path(config, path)
    if where is None:
        module, _, name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
            where = _section(cls) if isinstance(cls, type) else ""
        except Exception:  # an import problem is reported by the parser itself; the reason still stands
            where = ""
    return f"{where} ({path}): {reason}" if where else f"{path}: {reason}"


def _key_of_class_path(config: Any, path: str, prefix: str = "") -> str | None:
    """The first dotted key of ``config`` (a parsed config as nested dicts and lists) whose value is
    ``{class_path: path, ...}``; None when there is none (or no config)."""
    if isinstance(config, dict):
        if prefix and config.get("class_path") == path:
            return prefix
        items = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in config.items()]
    elif isinstance(config, list):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(config)]
    else:
        return None
    return next((found for key, v in items if (found := _key_of_class_path(v, path, key))), None)


def _raising_class(error: BaseException) -> type | None:
    """The class of the outermost ``__init__`` (outside jsonargparse and Lightning's CLI) in ``error``'s traceback."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner: Any = frame.f_locals.get("self")
        module = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "__init__" and owner is not None and not module.startswith(
            ("jsonargparse", "lightning.pytorch.cli")
        ):
            return type(owner)
        tb = tb.tb_next
    return None


def _section(cls: type) -> str:
    """The config section a class usually sits in (``model``, ``data``, ``trainer.callbacks`` ...) or ``""``."""
    import lightning as L
    from lightning.pytorch.loggers import Logger

    for base, name in ((L.LightningModule, "model"), (L.LightningDataModule, "data"), (L.Callback, "trainer.callbacks"),
                       (L.Trainer, "trainer"), (Logger, "trainer.logger")):
        if issubclass(cls, base):
            return name
    return ""
