"""The hash chain that names a chat message in its context (docs/reference.md §4).

Message i of a request gets h_i = sha256(i, role, content, tool_calls, tool_call_id, name, h_{i-1});
h_{-1} hashes the request's tools. Equal keys mean equal conversation prefixes, which is how the
MessageTracker recognises a history it has already tokenized.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from typing import Any


def _canonical_arguments(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
    except (ValueError, RecursionError):
        return arguments


_JSON = json.JSONEncoder(ensure_ascii=False)  # = json.dumps(x, ensure_ascii=False) without a new encoder per call


def chain_key(index: int, message: dict[str, Any], parent: str) -> str:
    """h_i of a normalized message (tool-call arguments compared as JSON values)."""
    calls = [
        [c["id"], c["function"]["name"], _canonical_arguments(c["function"]["arguments"])]
        for c in message.get("tool_calls") or ()
    ]
    payload = [index, message["role"], message["content"], calls, message.get("tool_call_id"),
               message.get("name"), parent]
    return hashlib.sha256(_JSON.encode(payload).encode("utf-8")).hexdigest()


def _tools_json(tools: Sequence[dict[str, Any]] | None) -> str:
    return json.dumps(list(tools), ensure_ascii=False) if tools else "[]"  # order kept: it is rendered


def tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
    return _tools_key(_tools_json(tools))


@functools.lru_cache(maxsize=256)
def _tools_key(tools_json: str) -> str:
    return hashlib.sha256(f"arl-tracker-tools|{tools_json}".encode()).hexdigest()


def _memo_key(index: int, message: dict[str, Any], parent: str) -> tuple[Any, ...]:
    """Everything `chain_key` reads of a normalized message, as a hashable tuple.

    Python caches a str's hash and compares an object to itself by identity, so when an agent
    re-sends the same message objects (the usual growing history) looking this tuple up costs a
    few hundred nanoseconds, where `chain_key` JSON-encodes and sha256-hashes the whole content.
    Raw tool-call arguments are used (not the canonical JSON): they determine the canonical form.
    Content given as parts (a user message with images) is a list, so its JSON stands for it.
    """
    content = message["content"]
    if type(content) is not str:
        content = _JSON.encode(content)
    if len(message) == 2:  # normalized {"role", "content"}, the common case; the length tells it apart
        return (index, message["role"], content, parent)
    calls = tuple(
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()
    )
    return (index, message["role"], content, calls, message.get("tool_call_id"), message.get("name"), parent)
