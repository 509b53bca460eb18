"""<tool_call> parsing: valid blocks become OpenAI tool calls, everything else stays content."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from arl.intercept.toolcalls import parse_tool_calls

MOVE = '<tool_call>\n{"name": "move", "arguments": {"direction": "Up"}}\n</tool_call>'


def test_single_call():
    content, calls = parse_tool_calls(MOVE)
    assert content is None
    assert calls == [{"id": "call_0", "type": "function",
                      "function": {"name": "move", "arguments": '{"direction": "Up"}'}}]


def test_text_around_and_several_calls():
    text = f"I will move.\n{MOVE}\n{MOVE.replace('Up', 'Left')} done"
    content, calls = parse_tool_calls(text, id_prefix="call_7")
    assert content == "I will move.\n\n done"
    assert [c["id"] for c in calls] == ["call_7_0", "call_7_1"]
    assert [json.loads(c["function"]["arguments"])["direction"] for c in calls] == ["Up", "Left"]


def test_string_arguments_are_kept():
    content, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert calls[0]["function"]["arguments"] == '{"a": 1}'


def test_malformed_blocks_stay_content():
    for text in [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # arguments not an object
        '<tool_call>["name"]</tool_call>',
        '<tool_call>{"name": "f"',  # unterminated
        "no calls at all",
    ]:
        assert parse_tool_calls(text) == (text, [])
    mixed = f"<tool_call>oops</tool_call>{MOVE}"
    content, calls = parse_tool_calls(mixed)
    assert content == "<tool_call>oops</tool_call>" and len(calls) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(
    [*'<>/{}":,[]\\\n ab', "<tool_call>", "</tool_call>", '"name"', '"arguments"', '"f"', "{}", "1"]
)).map("".join))
def test_never_raises(text):
    content, calls = parse_tool_calls(text)
    assert content is None or isinstance(content, str)
    for call in calls:
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
