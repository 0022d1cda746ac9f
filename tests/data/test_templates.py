"""Rendering prompts with a prefix/suffix or a chat template."""

from __future__ import annotations

from typing import Any

import pytest

from lit_rlft.data.loading import DataValidationError
from lit_rlft.data.templates import BOXED_SYSTEM_PROMPT, render_prompt, render_prompts


class FakeChatTokenizer:
    """Records the messages it is given; renders them in a ChatML-like format."""

    chat_template = "{% fake %}"
    name_or_path = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, str]], dict[str, Any]]] = []

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        self.calls.append((messages, kwargs))
        body = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return body + "<|assistant|>"


def test_plain_rendering() -> None:
    assert render_prompt("12 7 3>81=") == "12 7 3>81="
    assert render_prompt("Q", prefix="Question: ", suffix="\nAnswer:") == "Question: Q\nAnswer:"
    assert render_prompt("Q", system_prompt="Be brief.", prefix="> ") == "Be brief.\n> Q"
    assert render_prompts(["a", "b"], suffix="=") == ["a=", "b="]


def test_chat_template_rendering() -> None:
    tok = FakeChatTokenizer()
    out = render_prompt("What is 2+2?", tok, chat_template=True, system_prompt=BOXED_SYSTEM_PROMPT)
    messages, kwargs = tok.calls[-1]
    assert messages == [
        {"role": "system", "content": BOXED_SYSTEM_PROMPT},
        {"role": "user", "content": "What is 2+2?"},
    ]
    assert kwargs == {"tokenize": False, "add_generation_prompt": True}
    assert out.endswith("<|assistant|>")
    render_prompt("x", tok, chat_template=True)
    assert tok.calls[-1][0] == [{"role": "user", "content": "x"}]


def test_chat_template_errors() -> None:
    with pytest.raises(DataValidationError, match="chat_template: false"):
        render_prompt("x", None, chat_template=True)

    class NoTemplate:
        chat_template = None

    with pytest.raises(DataValidationError, match="no chat template.*prefix/suffix"):
        render_prompt("x", NoTemplate(), chat_template=True)


def test_boxed_constant() -> None:
    assert BOXED_SYSTEM_PROMPT == "Let's think step by step and output the final answer within \\boxed{}."
