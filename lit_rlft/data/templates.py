"""Turn a raw prompt into the text the policy sees: plain prefix/suffix, or the tokenizer's chat template."""

from __future__ import annotations

from typing import Any

from lit_rlft.data.sources import DataValidationError

__all__ = ["BOXED_SYSTEM_PROMPT", "render_prompt", "render_prompts"]

#: System prompt for answers graded from the last ``\boxed{...}`` (MATH, GSM8K with math-verify).
BOXED_SYSTEM_PROMPT: str = "Let's think step by step and output the final answer within \\boxed{}."


def render_prompt(
    text: str,
    tokenizer: Any | None = None,
    *,
    chat_template: bool = False,
    system_prompt: str | None = None,
    prefix: str = "",
    suffix: str = "",
) -> str:
    """Render one raw prompt.

    Without a chat template the result is ``system_prompt + "\\n" + prefix + text + suffix`` (the system part
    only when ``system_prompt`` is given). With ``chat_template=True`` it is
    ``tokenizer.apply_chat_template([system?, user], tokenize=False, add_generation_prompt=True)``; ``prefix`` and
    ``suffix`` then wrap the user message's content.

    Args:
        text: The raw prompt.
        tokenizer: A Hugging Face tokenizer; needed only with ``chat_template=True``.
        chat_template: Use the tokenizer's chat template.
        system_prompt: Optional system message.
        prefix: Text before the prompt.
        suffix: Text after the prompt.

    Returns:
        The rendered prompt text (not tokenized).

    Raises:
        DataValidationError: ``chat_template=True`` with no tokenizer, or a tokenizer without a chat template.
    """
    if not chat_template:
        head = f"{system_prompt}\n" if system_prompt is not None else ""
        return f"{head}{prefix}{text}{suffix}"
    if tokenizer is None:
        raise DataValidationError(
            "chat_template=True needs a tokenizer; set chat_template: false or give a prefix/suffix instead"
        )
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        raise DataValidationError(
            f"tokenizer {name!r} has no chat template; set chat_template: false or give a prefix/suffix instead"
        )
    messages: list[dict[str, str]] = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": f"{prefix}{text}{suffix}"})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render_prompts(
    texts: list[str],
    tokenizer: Any | None = None,
    *,
    chat_template: bool = False,
    system_prompt: str | None = None,
    prefix: str = "",
    suffix: str = "",
) -> list[str]:
    """:func:`render_prompt` for a list of prompts."""
    return [
        render_prompt(
            t, tokenizer, chat_template=chat_template, system_prompt=system_prompt, prefix=prefix, suffix=suffix
        )
        for t in texts
    ]
