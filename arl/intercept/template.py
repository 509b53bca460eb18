"""What a chat template renders around messages, probed once per tokenizer and tool list.

The MessageTracker tokenizes a conversation message by message; for that it needs the template's
generation prompt, end-of-turn and separator tokens, found by rendering a dummy conversation.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import attrs

from arl.intercept.protocol import BadRequest

_DUMMY = (
    {"role": "system", "content": "arl dummy system"},
    {"role": "user", "content": "arl dummy user"},
)
_PROBE = "\x00arl-probe\x00"



class TemplateError(BadRequest):
    """The chat template could not render the request's messages."""

    code = "template_error"


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments as objects, as HF chat templates expect (vLLM's server does the same)."""
    if not message.get("tool_calls"):
        return message
    calls = []
    for c in message["tool_calls"]:
        try:
            args: Any = json.loads(c["function"]["arguments"])
        except (ValueError, RecursionError):
            args = c["function"]["arguments"]
        calls.append({**c, "function": {"name": c["function"]["name"], "arguments": args}})
    return {**message, "tool_calls": calls}


@attrs.frozen
class _Template:
    """What the template renders around messages, for one tokenizer and one tool list."""

    prefix_text: str  # rendering of the dummy pair
    gen_prompt_ids: tuple[int, ...]  # e.g. "<|im_start|>assistant\n"
    end_of_turn_ids: tuple[int, ...]  # e.g. "<|im_end|>"
    separator_ids: tuple[int, ...]  # e.g. "\n"


def _render(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any, gen: bool, kwargs: Any) -> str:
    return tokenizer.apply_chat_template(
        [_for_template(m) for m in messages], tools=list(tools) if tools else None, tokenize=False,
        add_generation_prompt=gen, **dict(kwargs),
    )


@functools.lru_cache(maxsize=64)
def _template(tokenizer: Any, tools_json: str, kwargs: tuple[tuple[str, Any], ...]) -> _Template:
    tools = json.loads(tools_json)
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    prefix = _render(tokenizer, _DUMMY, tools, False, kwargs)
    with_gen = _render(tokenizer, _DUMMY, tools, True, kwargs)
    if not with_gen.startswith(prefix):
        raise TemplateError("chat template: the generation prompt does not extend the conversation")
    probe = _render(tokenizer, [*_DUMMY, {"role": "assistant", "content": _PROBE}], tools, False, kwargs)
    tail = encode(probe[probe.index(_PROBE) + len(_PROBE) :])
    special = set(tokenizer.all_special_ids)
    cut = next((k + 1 for k, t in enumerate(tail) if t in special), None)
    if cut is None:  # no special end-of-turn in the template: fall back to EOS
        eot = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        sep = tail
    else:
        eot, sep = tail[:cut], tail[cut:]
    return _Template(prefix, tuple(encode(with_gen[len(prefix) :])), tuple(eot), tuple(sep))
