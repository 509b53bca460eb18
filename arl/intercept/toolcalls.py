"""Tool calls in model output: the ``<tool_call>{json}</tool_call>`` convention (Qwen, Hermes).

`parse_tool_calls(text)` turns the blocks into OpenAI ``tool_calls`` and leaves everything else
as content. It never raises: a block whose body is not a JSON object with a string ``name`` (and
an object or JSON-string ``arguments``) stays in the content verbatim, as does an unterminated
``<tool_call>``. Model output is data, however malformed.
"""

from __future__ import annotations

import json
import re
from typing import Any

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _call_of(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON string) of one block body, or None when it is not a valid call."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments already serialized
        try:
            if not isinstance(json.loads(arguments), dict):
                return None
        except (ValueError, RecursionError):
            return None
        return obj["name"], arguments
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)


def parse_tool_calls(text: str, id_prefix: str = "call") -> tuple[str | None, list[dict[str, Any]]]:
    """Split model output into (content, tool_calls).

    Valid blocks become ``{"id": f"{id_prefix}_{k}", "type": "function", "function": {"name",
    "arguments"}}`` (k counts the valid calls); the rest of the text, stripped, is the content
    (None when nothing but whitespace is left and there are calls, as OpenAI returns it).
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for match in _BLOCK.finditer(text):
        call = _call_of(match.group(1))
        if call is None:
            continue  # stays in the content: the text up to the next kept cut includes it
        kept.append(text[pos : match.start()])
        pos = match.end()
        name, arguments = call
        calls.append({
            "id": f"{id_prefix}_{len(calls)}", "type": "function",
            "function": {"name": name, "arguments": arguments},
        })
    kept.append(text[pos:])
    if not calls:
        return text, []
    content = "".join(kept).strip()
    return content or None, calls
