"""Tool calling for multi-turn rollouts: tool schemas, the Hermes tool-call parser, a tool environment and a calculator.

A tool is a plain Python function with type hints and a Google-style docstring (an ``Args:`` section describing
every argument); :func:`function_schema` turns it into the JSON schema that chat templates render into the prompt,
exactly as ``transformers`` builds it (``tokenizer.apply_chat_template(..., tools=[fn])``).

The policy calls tools in the Hermes / Qwen2.5 format that the Qwen and SmolLM chat templates teach::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2*(3+4)"}}
    </tool_call>

:class:`ToolEnvironment` parses the calls of the policy's last turn (:func:`parse_tool_calls`), runs each tool
in-process, with its stdout / stderr captured into a bounded buffer and new network connections refused
(:func:`no_network`), and answers with one ``{"role": "tool", "name": ..., "content": ...}`` message per call. A
tool's failure (unknown name, arguments that do not fit its signature, an exception) becomes an ``"error: ..."``
message for the policy to read, never an exception of the environment. A turn without tool calls ends the episode:
the policy has answered, and the reward functions score it.

The environment's ``step`` runs in a worker process that the episode runner kills on a timeout, so a tool that
hangs or eats memory costs its worker, not the training process; the network guard and the output bound are
guards against accidents of ordinary tools, not a sandbox for hostile code.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import math
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_rlft.envs.base import Environment, EnvStep, Message
from lit_rlft.runtime.imports import import_object

__all__ = [
    "NETWORK_DISABLED_MESSAGE",
    "ToolCall",
    "ToolEnvironment",
    "calculator",
    "function_schema",
    "no_network",
    "parse_tool_calls",
    "resolve_tool",
]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_CALL_FORMAT = '<tool_call>{"name": <tool name>, "arguments": {<argument>: <value>, ...}}</tool_call>'

NETWORK_DISABLED_MESSAGE = "network access is disabled for tools (ToolEnvironment(allow_network=True) allows it)"
"""The message of the :class:`PermissionError` a tool gets when it connects while :func:`no_network` is active."""


# --------------------------------------------------------------------------------------------------------- schemas


def function_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a tool function, exactly as ``transformers.utils.get_json_schema`` builds it:
    ``{"type": "function", "function": {"name", "description", "parameters": {"type": "object", "properties",
    "required"}, ["return"]}}``.

    Raises:
        ValueError: the schema cannot be built (no docstring, an argument without a type hint or without a
            description in the docstring's ``Args:`` section), naming the function and what is missing.
    """
    from transformers.utils import get_json_schema

    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers' DocstringParsingException / TypeHintParsingException and others
        raise ValueError(
            f"tool {name}: cannot build its JSON schema: {e} (a tool needs type hints on every argument and a "
            "Google-style docstring with a description and an 'Args:' section describing every argument)"
        ) from e


# --------------------------------------------------------------------------------------------------------- parsing


@dataclass
class ToolCall:
    """One parsed tool call.

    Attributes:
        name: the tool's name (a function's ``__name__``).
        arguments: keyword arguments, as decoded from JSON.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def _parse_block(body: str) -> ToolCall:
    """The call in one ``<tool_call>`` block's body; ValueError saying what is wrong."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"the block is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"the block holds a JSON {type(obj).__name__}, not an object")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError('the block has no "name" (a non-empty string)')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string holding the object
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as e:
            raise ValueError(f'"arguments" of {name!r} is a string that is not valid JSON ({e})') from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError(f'"arguments" of {name!r} is a JSON {type(arguments).__name__}, not an object')
    return ToolCall(name.strip(), arguments)


def _scan(text: str) -> list[ToolCall | str]:
    """The blocks of ``text`` in order: a :class:`ToolCall` per parsed block, an error message per bad one.
    Linear time: one forward ``find`` pair per block; an unclosed block ends the scan."""
    items: list[ToolCall | str] = []
    pos = 0
    while True:
        start = text.find(_OPEN, pos)
        if start == -1:
            return items
        body_start = start + len(_OPEN)
        end = text.find(_CLOSE, body_start)
        if end == -1:
            items.append(f"error: invalid tool call: unclosed {_OPEN} block (no {_CLOSE}); expected {_CALL_FORMAT}")
            return items
        try:
            items.append(_parse_block(text[body_start:end]))
        except ValueError as e:
            items.append(f"error: invalid tool call: {e}; expected {_CALL_FORMAT}")
        pos = end + len(_CLOSE)


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """Parse the Hermes / Qwen2.5 tool calls of a policy turn.

    Every ``<tool_call>...</tool_call>`` block must hold a JSON object ``{"name": str, "arguments": {...}}``;
    ``arguments`` may also be a JSON string holding an object, and may be left out (no arguments). Text outside
    the blocks is ignored.

    Returns:
        The calls parsed, in order, and one ``"error: invalid tool call: ..."`` message per block that could not be
        parsed (bad JSON, no name, arguments not an object, a block never closed), in order.

    >>> parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    ([ToolCall(name='f', arguments={'x': 1})], [])
    """
    items = _scan(text)
    return [i for i in items if isinstance(i, ToolCall)], [i for i in items if isinstance(i, str)]


# ------------------------------------------------------------------------------------------------ running guards


def _network_disabled(*args: Any, **kwargs: Any) -> Any:
    raise PermissionError(NETWORK_DISABLED_MESSAGE)


_MISSING = object()


@contextlib.contextmanager
def no_network() -> Iterator[None]:
    """Refuse new network connections inside the block: ``socket.socket.connect``, ``socket.socket.connect_ex``,
    ``socket.create_connection`` and ``socket.getaddrinfo`` raise :class:`PermissionError`
    (:data:`NETWORK_DISABLED_MESSAGE`); the originals are restored on exit, also when the block raises.

    Only code that looks these up at call time is stopped (``urllib``, ``http.client``, ``requests``); this guards
    against accidents, it is not a sandbox.
    """
    saved_methods = {name: socket.socket.__dict__.get(name, _MISSING) for name in ("connect", "connect_ex")}
    saved_functions = {name: getattr(socket, name) for name in ("create_connection", "getaddrinfo")}
    try:
        for name in saved_methods:
            setattr(socket.socket, name, _network_disabled)
        for name in saved_functions:
            setattr(socket, name, _network_disabled)
        yield
    finally:
        for name, original in saved_methods.items():
            if original is _MISSING:  # inherited from _socket.socket: remove the override
                with contextlib.suppress(AttributeError):
                    delattr(socket.socket, name)
            else:
                setattr(socket.socket, name, original)
        for name, original in saved_functions.items():
            setattr(socket, name, original)


class _BoundedBuffer(io.TextIOBase):
    """A text stream that keeps the first ``limit`` characters written to it and counts the rest (``dropped``)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = self.limit - self.kept
        if room > 0:
            self.parts.append(s[:room])
            self.kept += min(room, len(s))
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def getvalue(self) -> str:
        return "".join(self.parts)


def _truncate(text: str, limit: int, dropped: int = 0) -> str:
    """``text`` cut to ``limit`` characters, with a marker counting what was cut (``dropped`` more were never kept)."""
    more = max(0, len(text) - limit) + dropped
    if more == 0:
        return text
    return text[:limit] + f"... [truncated, {more} more characters]"


# ------------------------------------------------------------------------------------------------ the environment


def resolve_tool(tool: Callable[..., Any] | str) -> Callable[..., Any]:
    """A tool given as a function or as a dotted import path (``"lit_rlft.envs.calculator"``, also
    ``"package.module.Class.method"``); ValueError naming the path when it cannot be imported or is not callable."""
    if not isinstance(tool, str):
        if not callable(tool):
            raise ValueError(f"tool {tool!r} is not callable (give a function or a dotted import path)")
        return tool
    path = tool.strip()
    parts = path.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ValueError(f"tool {tool!r}: not a dotted import path like 'package.module.function'")
    try:
        # allow_module=False: "pkg.tool" is the function pkg/__init__.py exports, not the submodule of that name
        obj = import_object(path, "tool", allow_module=False,
                            no_attribute="cannot resolve {what} {path!r}: {owner!r} has no attribute {attribute!r}")
    except ValueError:
        raise
    except Exception as e:  # the module exists but its import failed (a missing dependency, an error in its code)
        raise ValueError(f"tool {tool!r}: importing it failed: {type(e).__name__}: {e}") from e
    if not callable(obj):
        raise ValueError(f"tool {tool!r} is not callable (it is a {type(obj).__name__})")
    return obj


class ToolEnvironment(Environment):
    """An environment that runs the tools the policy calls and returns their results as ``tool`` messages.

    Choose it in YAML::

        model:
          environment:
            class_path: lit_rlft.envs.ToolEnvironment
            init_args: {tools: [lit_rlft.envs.calculator], max_calls_per_turn: 4}

    ``step`` parses the tool calls of the policy's last turn. None and no malformed block: the episode ends
    (``EnvStep(done=True)``, no environment reward). Otherwise every block gives one observation message, in the
    order of the text: ``{"role": "tool", "name": <tool>, "content": <result>}`` for a call (the first
    ``max_calls_per_turn`` run; the others are answered ``"error: too many tool calls ..."``), and
    ``{"role": "tool", "name": "invalid_tool_call", "content": "error: ..."}`` for a malformed block. A result is
    ``str(return value)`` followed by what the tool printed (stdout and stderr, captured), or
    ``"error: <ExceptionType>: <message>"`` when the tool raised; an unknown tool name or arguments that do not fit
    the tool's signature are errors too. Every content is cut to ``max_result_chars`` characters plus a
    ``"... [truncated, N more characters]"`` marker.

    Args:
        tools: functions, or dotted import paths of functions; each needs type hints and a Google-style docstring
            (its schema is built here, so a bad docstring fails at start-up). Names are the functions' ``__name__``
            and must be unique.
        max_calls_per_turn: calls run per policy turn; further calls are answered with an error and count as
            failures.
        max_result_chars: longest content of one observation message (before the truncation marker); a tool's
            captured output is kept only up to this many characters while it runs.
        allow_network: let tools open network connections (refused by default, see :func:`no_network`).
        name: shown in the logs and in failure messages.
    """

    def __init__(
        self,
        tools: list[Callable[..., Any] | str],
        max_calls_per_turn: int = 4,
        max_result_chars: int = 2000,
        allow_network: bool = False,
        name: str = "tools",
    ) -> None:
        if isinstance(tools, (str, bytes)) or callable(tools):
            tools = [tools]  # type: ignore[list-item]
        if not tools:
            raise ValueError("ToolEnvironment needs at least one tool")
        if not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn must be an integer >= 1, got {max_calls_per_turn!r}")
        if not isinstance(max_result_chars, int) or max_result_chars < 1:
            raise ValueError(f"max_result_chars must be an integer >= 1, got {max_result_chars!r}")
        self.tools: dict[str, Callable[..., Any]] = {}
        self.schemas: list[dict[str, Any]] = []
        for spec in tools:
            fn = resolve_tool(spec)
            tool_name = getattr(fn, "__name__", None)
            if not isinstance(tool_name, str) or not tool_name.isidentifier():
                raise ValueError(f"tool {spec!r} has no usable __name__ (give a plain function)")
            if tool_name in self.tools:
                raise ValueError(f"two tools are named {tool_name!r}: tool names (the functions' __name__) must be "
                                 "unique")
            self.schemas.append(function_schema(fn))
            self.tools[tool_name] = fn
        self.max_calls_per_turn = max_calls_per_turn
        self.max_result_chars = max_result_chars
        self.allow_network = allow_network
        self.name = name

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas (:func:`function_schema`), in the order given."""
        return [dict(s) for s in self.schemas]

    def step(self, messages: Sequence[Message], row: dict[str, Any]) -> EnvStep:
        """Run the tool calls of ``messages[-1]`` (see the class docstring); ``row`` is not used."""
        if not messages:
            raise ValueError(f"{self.name}: step needs the episode's messages (got none)")
        items = _scan(messages[-1].get("content") or "")
        if not items:
            return EnvStep(done=True)
        observation: list[Message] = []
        calls = failures = run = 0
        for item in items:
            calls += 1
            if isinstance(item, str):
                failures += 1
                content = _truncate(item, self.max_result_chars)
                observation.append({"role": "tool", "name": "invalid_tool_call", "content": content})
                continue
            if run >= self.max_calls_per_turn:
                ok, content = False, _truncate(f"error: too many tool calls in one turn (at most "
                                               f"{self.max_calls_per_turn}); this call was not run",
                                               self.max_result_chars)
            else:
                run += 1
                ok, content = self.call(item)
            failures += 0 if ok else 1
            observation.append({"role": "tool", "name": item.name, "content": content})
        return EnvStep(observation=observation, tool_calls=calls, tool_failures=failures)

    def call(self, call: ToolCall) -> tuple[bool, str]:
        """Run one call; returns (succeeded, observation content). Never raises for the tool's errors."""
        limit = self.max_result_chars
        fn = self.tools.get(call.name)
        if fn is None:
            return False, _truncate(f"error: unknown tool {call.name!r} (available: {', '.join(self.tools)})", limit)
        try:
            bound = inspect.signature(fn).bind(**call.arguments)
        except TypeError as e:
            return False, _truncate(f"error: bad arguments for {call.name}: {e}", limit)
        output = _BoundedBuffer(limit)
        ok = True
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(contextlib.redirect_stdout(output))
                stack.enter_context(contextlib.redirect_stderr(output))
                if not self.allow_network:
                    stack.enter_context(no_network())
                result = fn(*bound.args, **bound.kwargs)
            text = str(result)
        except (Exception, SystemExit) as e:
            ok, text = False, f"error: {type(e).__name__}: {e}"
        printed = output.getvalue()
        if printed:
            text = f"{text}\n{printed}" if text else printed
        return ok, _truncate(text, limit, output.dropped)


# ------------------------------------------------------------------------------------------------------ calculator

MAX_EXPRESSION_LENGTH = 500
"""Longest expression (characters) :func:`calculator` evaluates."""
MAX_EXPONENT = 1000
"""Largest absolute exponent of ``**``."""
MAX_DIGITS = 100
"""Largest integer (operand or intermediate result) :func:`calculator` handles, in decimal digits."""

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_INT_LIMIT = 10**MAX_DIGITS


def _checked(value: int | float) -> int | float:
    if isinstance(value, int) and abs(value) >= _INT_LIMIT:
        raise ValueError(f"number too large (more than {MAX_DIGITS} digits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is not a finite number")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent!r} too large (at most {MAX_EXPONENT} in absolute value)")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1 \
            and exponent * math.log10(abs(base)) >= MAX_DIGITS:
        raise ValueError(f"number too large (more than {MAX_DIGITS} digits)")
    value = base**exponent
    if isinstance(value, complex):  # a negative base to a fractional power
        raise ValueError("result is not a real number")
    return value


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ValueError(f"unsupported constant {node.value!r} (only numbers)")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        op = _BINARY.get(type(node.op))
        if op is None:
            raise ValueError(f"unsupported operator {type(node.op).__name__} (use + - * / // % **)")
        return _checked(op(left, right))
    raise ValueError(f"unsupported construct {type(node).__name__} (only numbers, + - * / // % **, parentheses)")


def _format_number(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    rounded = float(f"{value:.6g}")
    if rounded.is_integer() and abs(rounded) < 1e15:
        return str(int(rounded))
    return repr(rounded)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, with numbers, + - * / // % ** and parentheses, e.g. "2*(3+4)".
    """
    # Integers print exactly ("14"); other results as the float rounded to 6 significant digits ("3.5"). Untrusted
    # input: parsed with ast and evaluated node by node, never eval'd; integers are capped at MAX_DIGITS digits and
    # exponents at MAX_EXPONENT. ValueError names an unsupported construct or a number out of range;
    # ZeroDivisionError as in Python.
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise ValueError("empty expression")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ValueError(f"invalid expression: {getattr(e, 'msg', None) or e}") from None
    try:
        value = _evaluate(tree)
    except RecursionError:
        raise ValueError("expression nested too deeply") from None
    except OverflowError:
        raise ValueError("result out of range (too large a number)") from None
    return _format_number(value)
