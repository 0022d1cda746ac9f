"""How an environment's observation messages become tokens appended to an episode.

The policy's turn ends with its stop token (``<|im_end|>`` in ChatML templates, ``<eos>`` for the tiny policy); the
observation's tokens follow it, then the policy's next turn. Nothing already in the episode is re-tokenised: the
episode is the concatenation of exactly what the policy sampled and what the environment said, so the log-probs the
update computes over the episode are those of the tokens the engine sampled.

- :class:`ChatFormat`: the tokenizer's chat template renders the messages, as TRL does for tool results: the suffix
  that ``[user, assistant] + observation`` adds to ``[user, assistant]`` (cut after the assistant's end-of-turn
  token), with the generation prompt of the next assistant turn.
- :class:`TextFormat`: plain text per role, for models without a chat template (the tiny character-level policy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lit_rlft.envs.base import Message

__all__ = ["ChatFormat", "ObservationFormat", "TextFormat", "observation_format"]


class ObservationFormat:
    """Observation messages -> the token ids appended after the policy's turn."""

    def tokens(self, messages: Sequence[Message]) -> list[int]:
        raise NotImplementedError


class TextFormat(ObservationFormat):
    """Each message rendered by its role's template (``{content}`` and ``{name}`` are filled in), tokenised without
    special tokens.

    Args:
        tokenizer: the policy's tokenizer.
        templates: role -> template; the defaults wrap tool results in ``<tool_response>`` tags (Hermes' names)
            and put environment messages on a line of their own.
    """

    DEFAULT_TEMPLATES: Mapping[str, str] = {
        "tool": "\n<tool_response>\n{content}\n</tool_response>\n",
        "user": "\n{content}\n",
    }

    def __init__(self, tokenizer: Any, templates: Mapping[str, str] | None = None):
        self.tokenizer = tokenizer
        self.templates = dict(self.DEFAULT_TEMPLATES if templates is None else templates)

    def text(self, messages: Sequence[Message]) -> str:
        parts = []
        for m in messages:
            role = m.get("role", "user")
            if role not in self.templates:
                raise ValueError(f"TextFormat has no template for role {role!r} (roles: {sorted(self.templates)})")
            parts.append(self.templates[role].format(content=m.get("content", ""), name=m.get("name", "")))
        return "".join(parts)

    def tokens(self, messages: Sequence[Message]) -> list[int]:
        return list(self.tokenizer(self.text(messages), add_special_tokens=False)["input_ids"])


class ChatFormat(ObservationFormat):
    """The tokenizer's chat template renders the observation and opens the next assistant turn.

    Args:
        tokenizer: a tokenizer with a chat template.
        tools: tool schemas passed to the template (some templates render tool messages by the tools' names).
    """

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
            raise ValueError(f"tokenizer {name!r} has no chat template: use observation_format: text")
        self.tokenizer = tokenizer
        self.tools = tools or None
        self._dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "dummy"}]
        prefix = self._render(self._dummy, add_generation_prompt=False)
        eos = getattr(tokenizer, "eos_token_id", None)
        ends = [i for i, t in enumerate(prefix) if t == eos]
        self._prefix = prefix[: ends[-1] + 1] if ends else prefix  # up to the assistant's end of turn

    def _render(self, messages: list[Message], add_generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=True,
                                                 add_generation_prompt=add_generation_prompt, return_dict=False)
        return list(out)

    def tokens(self, messages: Sequence[Message]) -> list[int]:
        full = self._render(self._dummy + [dict(m) for m in messages], add_generation_prompt=True)
        if full[: len(self._prefix)] != self._prefix:
            raise ValueError("ChatFormat: the chat template renders the conversation before the observation "
                             "differently once the observation follows; use observation_format: text")
        return full[len(self._prefix):]


def observation_format(kind: str, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> ObservationFormat:
    """``"chat"``, ``"text"`` or ``"auto"`` (chat when the tokenizer has a chat template)."""
    if kind == "auto":
        kind = "chat" if getattr(tokenizer, "chat_template", None) else "text"
    if kind == "chat":
        return ChatFormat(tokenizer, tools)
    if kind == "text":
        return TextFormat(tokenizer)
    raise ValueError(f"model.episodes.observation_format must be 'auto', 'chat' or 'text', got {kind!r}")
