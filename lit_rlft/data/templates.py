"""Turn a raw prompt into the text the policy sees: plain prefix/suffix, or the tokenizer's chat template."""

from __future__ import annotations

import json
from typing import Any

from lit_rlft.data.loading import DataValidationError

__all__ = ["BOXED_SYSTEM_PROMPT", "TOOLS_SYSTEM_PROMPT", "render_prompt", "render_prompts", "tools_system_prompt"]

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
    tools: list[dict[str, Any]] | None = None,
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
        tools: JSON schemas of the tools the policy may call, passed to the chat template (TRL's ``tools``); the
            environment's (``model.environment``) when multi-turn episodes call tools. A template that ignores them
            gets them in its system message (:data:`TOOLS_SYSTEM_PROMPT`, replacing the template's default system
            message). Ignored without a chat template.

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
    extra = {"tools": tools} if tools else {}  # without tools: the call as before
    out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    if tools and out == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True):
        # the template ignores tools (SmolLM2's does): describe them in the system message, in Hermes' words
        described = tools_system_prompt(tools)
        system = f"{system_prompt}\n\n{described}" if system_prompt is not None else described
        messages = [{"role": "system", "content": system}, messages[-1]]
        out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return out


#: Hermes' tool instructions (Qwen2.5's chat template writes these), for templates that do not render tools.
TOOLS_SYSTEM_PROMPT = (
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """:data:`TOOLS_SYSTEM_PROMPT` with the tools' JSON schemas, one per line."""
    return TOOLS_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))


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
