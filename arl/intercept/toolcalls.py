"""Tool calls in model output: the ``<tool_call>{json}</tool_call>`` convention (Qwen, Hermes).

`parse_tool_calls(text)` turns the blocks into OpenAI ``tool_calls`` and leaves everything else
as content. It never raises: a block whose body is not a JSON object with a string ``name`` (and
an object or JSON-string ``arguments``) stays in the content verbatim, as does an unterminated
``<tool_call>``. Model output is data, however malformed.

`tool_call_tag(tools, name)` is the same convention as a constraint for the engine (an xgrammar
structural tag, `arl.engine.OutputConstraint`): how ``tool_choice`` ``"required"`` or a named tool
is enforced while sampling instead of hoped for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

_BEGIN, _END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(rf"{_BEGIN}(.*?){_END}", re.DOTALL)


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


def tool_call_tag(tools: Sequence[dict[str, Any]], name: str | None = None, *,
                  parallel: bool = True) -> dict[str, Any]:
    """An xgrammar structural tag that forces tool calls in the ``<tool_call>`` convention.

    Each tool becomes a tag ``<tool_call>\\n{"name": "<name>", "arguments": `` + a JSON object
    matching its ``parameters`` schema + ``}\\n</tool_call>``: the form `parse_tool_calls` reads and
    the chat templates render. ``name`` None (``tool_choice: "required"``): free text may come
    before and between calls, at least one call must come, and after the first one nothing else
    when ``parallel`` is False. ``name`` given (a named ``tool_choice``): the reply is exactly one
    call of that tool.

    >>> tools = [{"type": "function", "function": {"name": "move", "parameters": {
    ...     "type": "object", "properties": {"direction": {"enum": ["Left", "Right"]}},
    ...     "required": ["direction"]}}}]
    >>> tag = tool_call_tag(tools, "move")
    >>> tag["format"]["type"], tag["format"]["begin"]
    ('tag', '<tool_call>\\n{"name": "move", "arguments": ')
    >>> fmt = tool_call_tag(tools)["format"]
    >>> fmt["type"], fmt["triggers"], fmt["at_least_one"], fmt["stop_after_first"]
    ('triggered_tags', ['<tool_call>'], True, False)
    """
    def tag(function: dict[str, Any]) -> dict[str, Any]:
        schema = function.get("parameters") or {"type": "object"}
        return {"type": "tag", "begin": f'{_BEGIN}\n{{"name": {json.dumps(function["name"])}, "arguments": ',
                "content": {"type": "json_schema", "json_schema": schema}, "end": f"}}\n{_END}"}

    functions = [t["function"] for t in tools]
    if name is not None:
        chosen = [f for f in functions if f["name"] == name]
        if not chosen:
            raise ValueError(f"tool {name!r} is not among the tools {[f['name'] for f in functions]}")
        return {"type": "structural_tag", "format": tag(chosen[0])}
    if not functions:
        raise ValueError("a tool call cannot be required without tools")
    return {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": [_BEGIN], "tags": [tag(f) for f in functions],
        "at_least_one": True, "stop_after_first": not parallel}}
