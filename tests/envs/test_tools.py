"""Tool calling: exact schemas, the Hermes parser, ToolEnvironment's error paths and bounds, the network guard and the
calculator; every expected value is written out by hand."""

from __future__ import annotations

import json
import socket
import sys
import tracemalloc

import pytest

from lit_rlft.envs import (
    EnvStep,
    ToolCall,
    ToolEnvironment,
    calculator,
    function_schema,
    no_network,
    parse_tool_calls,
)
from lit_rlft.envs.tools import NETWORK_DISABLED_MESSAGE, _BoundedBuffer, resolve_tool

CONNECT = socket.socket.connect
CONNECT_EX = socket.socket.connect_ex
CREATE_CONNECTION = socket.create_connection
GETADDRINFO = socket.getaddrinfo


def _assert_network_restored() -> None:
    assert socket.socket.connect is CONNECT
    assert socket.socket.connect_ex is CONNECT_EX
    assert socket.create_connection is CREATE_CONNECTION
    assert socket.getaddrinfo is GETADDRINFO
    assert "connect" not in socket.socket.__dict__ and "connect_ex" not in socket.socket.__dict__


def turn(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# ------------------------------------------------------------------------------------------------------ sample tools


def get_weather(city: str, days: int = 1, units: str | None = None, tags: list[str] | None = None) -> dict[str, float]:
    """Get the weather forecast for a city.

    Args:
        city: The city's name.
        days: How many days ahead.
        units: Either "metric" or "imperial".
        tags: Labels to filter by.
    """
    return {"temperature": 21.5}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def explode(message: str) -> str:
    """Always raise.

    Args:
        message: The error's message.
    """
    raise RuntimeError(message)


def chatty(n: int) -> str:
    """Print n characters in chunks of 1000, then return "done".

    Args:
        n: How many characters to print.
    """
    chunk = "x" * 1000
    for _ in range(n // 1000):
        print(chunk, end="")
    return "done"


def noisy() -> str:
    """Write to stdout and stderr."""
    print("to stdout")
    print("to stderr", file=sys.stderr)
    return "result"


def connect_out() -> str:
    """Open a connection to example.com."""
    socket.create_connection(("example.com", 80), timeout=1)
    return "connected"


def probe_network() -> str:
    """Say whether every socket function is the original one while the tool runs."""
    same = (socket.socket.connect is CONNECT and socket.socket.connect_ex is CONNECT_EX
            and socket.create_connection is CREATE_CONNECTION and socket.getaddrinfo is GETADDRINFO)
    return "original" if same else "replaced"


def leave() -> str:
    """Call sys.exit."""
    sys.exit(3)


def no_doc_args(a: int) -> int:
    """Has no Args section."""
    return a


# ------------------------------------------------------------------------------------------------------ schemas


def test_function_schema_is_exactly_transformers_schema():
    assert function_schema(get_weather) == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name."},
                    "days": {"type": "integer", "description": "How many days ahead."},
                    "units": {"type": "string", "nullable": True, "description": 'Either "metric" or "imperial".'},
                    "tags": {"type": "array", "items": {"type": "string"}, "nullable": True,
                             "description": "Labels to filter by."},
                },
                "required": ["city"],
            },
            "return": {"type": "object", "additionalProperties": {"type": "number"}},
        },
    }


def test_calculator_schema():
    assert function_schema(calculator) == {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression and return its value.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {
                        "type": "string",
                        "description": 'The expression, with numbers, + - * / // % ** and parentheses, e.g. "2*(3+4)".',
                    }
                },
                "required": ["expression"],
            },
            "return": {"type": "string"},
        },
    }


def test_function_schema_names_the_function_and_the_missing_description():
    with pytest.raises(ValueError, match=r"no_doc_args.*no description for the argument 'a'"):
        function_schema(no_doc_args)


def test_function_schema_missing_type_hint_and_docstring():
    def untyped(a):
        """Untyped.

        Args:
            a: Something.
        """

    def undocumented(a: int) -> int:
        return a

    with pytest.raises(ValueError, match=r"untyped.*type hint"):
        function_schema(untyped)
    with pytest.raises(ValueError, match=r"undocumented.*docstring"):
        function_schema(undocumented)


# ------------------------------------------------------------------------------------------------------ parsing


def test_parse_two_good_blocks_and_one_bad_json_block():
    text = ("Let me compute. " + call("add", a=1, b=2) + " then <tool_call>{\"name\": \"add\", \"arguments\": {a: 1}}"
            "</tool_call> and " + call("calculator", expression="2*3") + " done.")
    calls, errors = parse_tool_calls(text)
    assert calls == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("calculator", {"expression": "2*3"})]
    assert len(errors) == 1
    assert errors[0].startswith("error: invalid tool call: the block is not valid JSON")


def test_parse_arguments_as_json_string_and_left_out():
    text = ('<tool_call>{"name": "add", "arguments": "{\\"a\\": 4, \\"b\\": 5}"}</tool_call>'
            '<tool_call>{"name": "noisy"}</tool_call>')
    assert parse_tool_calls(text) == ([ToolCall("add", {"a": 4, "b": 5}), ToolCall("noisy", {})], [])


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', '"arguments" of \'add\' is a JSON list'),
        ('<tool_call>{"name": "add", "arguments": "[1, 2]"}</tool_call>', '"arguments" of \'add\' is a JSON list'),
        ('<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>', "a string that is not valid JSON"),
        ('<tool_call>["add"]</tool_call>', "holds a JSON list, not an object"),
        ('<tool_call>{"name": "add", "arguments": {}}', "unclosed <tool_call> block"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
    ],
)
def test_parse_errors(block: str, says: str):
    calls, errors = parse_tool_calls("text before " + block)
    assert calls == []
    assert len(errors) == 1 and says in errors[0], errors


def test_parse_ignores_text_outside_blocks():
    assert parse_tool_calls('no call here {"name": "add", "arguments": {"a": 1}} </tool_call>') == ([], [])


def test_unclosed_block_after_a_good_one():
    calls, errors = parse_tool_calls(call("add", a=1, b=1) + '<tool_call>{"name": "add"')
    assert calls == [ToolCall("add", {"a": 1, "b": 1})]
    assert len(errors) == 1 and "unclosed" in errors[0]


# -------------------------------------------------------------------------------------------------- environment


def test_no_tool_call_ends_the_episode():
    env = ToolEnvironment([add])
    assert env.step(turn("The answer is 3."), {}) == EnvStep(done=True)


def test_a_raising_tool_gives_one_error_and_the_other_result_is_intact():
    env = ToolEnvironment([add, explode])
    step = env.step(turn(call("explode", message="boom") + call("add", a=2, b=3)), {})
    assert step == EnvStep(
        observation=[
            {"role": "tool", "name": "explode", "content": "error: RuntimeError: boom"},
            {"role": "tool", "name": "add", "content": "5"},
        ],
        tool_calls=2,
        tool_failures=1,
    )


def test_parse_errors_become_invalid_tool_call_messages_in_order():
    env = ToolEnvironment([add])
    step = env.step(turn(call("add", a=1, b=1) + "<tool_call>{bad}</tool_call>" + call("add", a=2, b=2)), {})
    assert [(m["name"], m["content"][:40]) for m in step.observation] == [
        ("add", "2"),
        ("invalid_tool_call", "error: invalid tool call: the block is n"),
        ("add", "4"),
    ]
    assert (step.done, step.tool_calls, step.tool_failures) == (False, 3, 1)


def test_only_a_bad_block_does_not_end_the_episode():
    step = ToolEnvironment([add]).step(turn("<tool_call>nope</tool_call>"), {})
    assert not step.done and step.tool_calls == 1 and step.tool_failures == 1
    assert step.observation[0]["name"] == "invalid_tool_call"


def test_unknown_tool():
    step = ToolEnvironment([add]).step(turn(call("multiply", a=2, b=3)), {})
    assert step.observation == [
        {"role": "tool", "name": "multiply", "content": "error: unknown tool 'multiply' (available: add)"}
    ]
    assert (step.tool_calls, step.tool_failures) == (1, 1)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"a": 1}, "error: bad arguments for add: missing a required argument: 'b'"),
        ({"a": 1, "b": 2, "c": 3}, "error: bad arguments for add: got an unexpected keyword argument 'c'"),
    ],
)
def test_bad_arguments(arguments: dict, message: str):
    step = ToolEnvironment([add]).step(turn(call("add", **arguments)), {})
    assert step.observation == [{"role": "tool", "name": "add", "content": message}]
    assert (step.tool_calls, step.tool_failures) == (1, 1)


def test_too_many_calls_are_answered_with_an_error_and_not_run():
    runs = []

    def record(x: int) -> int:
        """Record a call.

        Args:
            x: The value.
        """
        runs.append(x)
        return x

    env = ToolEnvironment([record], max_calls_per_turn=2)
    step = env.step(turn("".join(call("record", x=i) for i in range(4))), {})
    assert runs == [0, 1]
    too_many = "error: too many tool calls in one turn (at most 2); this call was not run"
    assert [m["content"] for m in step.observation] == ["0", "1", too_many, too_many]
    assert (step.tool_calls, step.tool_failures) == (4, 2)


def test_printing_5_mb_keeps_the_content_bounded():
    env = ToolEnvironment([chatty], max_result_chars=100)
    tracemalloc.start()
    try:
        step = env.step(turn(call("chatty", n=5_000_000)), {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    content = step.observation[0]["content"]
    # "done\n" + 5,000,000 printed characters: 100 kept, 5,000,005 - 100 = 4,999,905 cut
    marker = "... [truncated, 4999905 more characters]"
    assert content == ("done\n" + "x" * 95) + marker
    assert len(content) <= 100 + len(marker)
    assert peak < 1_000_000, f"capturing the output held {peak} bytes"  # an unbounded buffer holds 5 MB
    assert (step.tool_calls, step.tool_failures) == (1, 0)


def test_a_long_result_is_cut_with_a_marker():
    def long() -> str:
        """Return 50 characters."""
        return "y" * 50

    step = ToolEnvironment([long], max_result_chars=20).step(turn(call("long")), {})
    assert step.observation[0]["content"] == "y" * 20 + "... [truncated, 30 more characters]"


def test_stdout_and_stderr_are_captured_and_appended():
    step = ToolEnvironment([noisy]).step(turn(call("noisy")), {})
    assert step.observation[0]["content"] == "result\nto stdout\nto stderr\n"


def test_bounded_buffer():
    buf = _BoundedBuffer(5)
    assert buf.write("abc") == 3 and buf.write("defgh") == 5 and buf.write("ij") == 2
    assert (buf.getvalue(), buf.dropped) == ("abcde", 5)


def test_network_is_refused_and_restored():
    env = ToolEnvironment([connect_out, probe_network])
    step = env.step(turn(call("connect_out") + call("probe_network")), {})
    assert step.observation == [
        {"role": "tool", "name": "connect_out", "content": f"error: PermissionError: {NETWORK_DISABLED_MESSAGE}"},
        {"role": "tool", "name": "probe_network", "content": "replaced"},
    ]
    _assert_network_restored()


def test_allow_network_leaves_the_socket_functions_alone():
    step = ToolEnvironment([probe_network], allow_network=True).step(turn(call("probe_network")), {})
    assert step.observation[0]["content"] == "original"


def test_no_network_blocks_each_function_and_restores_on_exception():
    with pytest.raises(RuntimeError, match="inside"), no_network():
        for attempt in (
            lambda: socket.create_connection(("127.0.0.1", 9)),
            lambda: socket.getaddrinfo("example.com", 80),
        ):
            with pytest.raises(PermissionError, match="network access is disabled"):
                attempt()
        with socket.socket() as s:
            with pytest.raises(PermissionError):
                s.connect(("127.0.0.1", 9))
            with pytest.raises(PermissionError):
                s.connect_ex(("127.0.0.1", 9))
        raise RuntimeError("inside")
    _assert_network_restored()


def test_sys_exit_in_a_tool_is_an_error_message():
    step = ToolEnvironment([leave]).step(turn(call("leave")), {})
    assert step.observation[0]["content"] == "error: SystemExit: 3"


def test_calculator_through_the_environment():
    env = ToolEnvironment(["lit_rlft.envs.calculator"])
    assert env.tool_schemas() == [function_schema(calculator)]
    step = env.step(turn(call("calculator", expression="2*(3+4)") + call("calculator", expression="1/0")), {})
    assert [m["content"] for m in step.observation] == ["14", "error: ZeroDivisionError: division by zero"]
    assert (step.tool_calls, step.tool_failures) == (2, 1)


# ------------------------------------------------------------------------------------------------- construction


def test_tool_path_that_cannot_be_imported_is_named():
    with pytest.raises(ValueError, match="no_such_package_xyz.tool"):
        ToolEnvironment(["no_such_package_xyz.tool"])
    with pytest.raises(ValueError, match=r"lit_rlft.envs.no_such_tool.*no attribute"):
        ToolEnvironment(["lit_rlft.envs.no_such_tool"])
    with pytest.raises(ValueError, match=r"lit_rlft.envs.tools.MAX_DIGITS.*not callable"):
        ToolEnvironment(["lit_rlft.envs.tools.MAX_DIGITS"])
    with pytest.raises(ValueError, match="not a dotted import path"):
        ToolEnvironment(["calculator"])


def test_resolve_tool_paths():
    assert resolve_tool("lit_rlft.envs.calculator") is calculator
    assert resolve_tool("lit_rlft.envs.tools.calculator") is calculator
    assert resolve_tool(add) is add


def test_duplicate_names_and_bad_docstrings_fail_at_construction():
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        ToolEnvironment([calculator, "lit_rlft.envs.calculator"])
    with pytest.raises(ValueError, match="no_doc_args"):
        ToolEnvironment([add, no_doc_args])
    with pytest.raises(ValueError, match="max_calls_per_turn"):
        ToolEnvironment([add], max_calls_per_turn=0)


# --------------------------------------------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2*(3+4)", "14"),
        ("7/2", "3.5"),
        ("6/2", "3"),
        ("1/3", "0.333333"),
        ("-3 + 5", "2"),
        ("2**10", "1024"),
        ("2**-2", "0.25"),
        ("17 // 5", "3"),
        ("17 % 5", "2"),
        ("2**0.5", "1.41421"),
        ("1.5e3 * 2", "3000"),
        ("10**20", "100000000000000000000"),
    ],
)
def test_calculator_values(expression: str, value: str):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("2**1000000", "exponent"),
        ("__import__('os')", "unsupported construct Call"),
        ("x + 1", "unsupported construct Name"),
        ("'a' * 3", "unsupported constant"),
        ("True + 1", "unsupported constant"),
        ("3 < 4", "unsupported construct Compare"),
        ("1 << 3", "unsupported operator LShift"),
        ("10**99 * 10**99", "too large"),
        ("9**900", "too large"),
        ("10.0**400", "out of range"),
        ("(-8)**0.5", "not a real number"),
        ("1 +", "invalid expression"),
        ("1" * 501, "longer than 500"),
        ("", "empty"),
    ],
)
def test_calculator_rejects(expression: str, says: str):
    with pytest.raises(ValueError, match=says):
        calculator(expression)


def test_calculator_division_by_zero():
    with pytest.raises(ZeroDivisionError):
        calculator("1/0")
