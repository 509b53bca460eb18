"""ToolEnv: the move tool, the one-call-per-turn policy, and fuzzed messages never raising."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl.envs import TextEnv, ToolEnv

LEVEL = "######\n#P___#\n#_X__#\n#____#\n#_O__#\n######"


def call(direction, call_id="call_1", name="move", raw_arguments=None):
    arguments = json.dumps({"direction": direction}) if raw_arguments is None else raw_arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def message(*calls, content=None):
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


@pytest.fixture
def env() -> ToolEnv:
    tool_env = ToolEnv("arl/Sokoban-v0")
    tool_env.reset(seed=0, options={"level": LEVEL})
    return tool_env


def test_schema_and_attributes(env):
    assert env.game_name == "sokoban" and env.max_steps == 10
    assert env.action_names == ["Up", "Down", "Left", "Right"]
    (tool,) = env.tools
    assert tool["type"] == "function" and tool["function"]["name"] == "move"
    params = tool["function"]["parameters"]
    assert params["required"] == ["direction"]
    assert params["properties"]["direction"]["enum"] == env.action_names
    json.dumps(env.tools)  # wire-serialisable
    assert "move" in env.instructions and "Sokoban" in env.instructions


def test_valid_call_moves_and_answers_by_id(env):
    messages, reward, terminated, truncated, info = env.step(message(call("Right", "abc")))
    assert messages == [{"role": "tool", "tool_call_id": "abc", "content": messages[0]["content"]}]
    assert messages[0]["content"].startswith("######\n#_P__#")
    assert "Reward: -0.10" in messages[0]["content"] and "Steps used: 1/10" in messages[0]["content"]
    assert reward == pytest.approx(-0.1) and not terminated and not truncated
    assert info["action_valid"] and info["action_effective"] and info["action"] == "Right"
    assert info["error"] is None and info["raw_obs"].split("\n")[1] == "#_P__#"
    env.step(message(call("down")))  # case-insensitive direction
    messages, reward, terminated, _, info = env.step(message(call(" DOWN ")))
    assert terminated and info["success"] and reward == pytest.approx(10.9)
    assert "Success" in messages[0]["content"]


def test_arguments_as_dict_are_accepted(env):
    msg = message(
        {"id": "x", "type": "function", "function": {"name": "move", "arguments": {"direction": "Left"}}}
    )
    _messages, _reward, _t, _tr, info = env.step(msg)
    assert info["action_valid"] and not info["action_effective"]  # wall on the left


@pytest.mark.parametrize(
    ("msg", "error_part"),
    [
        ({"role": "assistant", "content": "<answer>Right</answer>"}, "no tool call"),
        ({"role": "assistant", "content": None, "tool_calls": []}, "no tool call"),
        (message(call("Right", name="jump")), "unknown tool"),
        (message(call(None, raw_arguments="{not json")), "not valid JSON"),
        (message(call(None, raw_arguments="[1, 2]")), "JSON object"),
        (message(call(None, raw_arguments="{}")), "missing required argument"),
        (message(call(None, raw_arguments='{"direction": 3}')), "must be a string"),
        (message(call(None, raw_arguments='{"direction": "Up", "speed": 2}')), "unexpected argument"),
        (message(call("North")), "unknown direction"),
        (message(call("Right", "a"), call("Down", "b")), "exactly one tool"),
        (message({"id": "z", "type": "function"}), "no 'function'"),
        (message("move right"), "must be an object"),
        ({"tool_calls": "move"}, "must be a list"),
        ("just a string", "must be an object"),
        (None, "must be an object"),
    ],
)
def test_malformed_messages_are_penalised_noops(env, msg, error_part):
    before = env.text_env.grid_text()
    messages, reward, terminated, truncated, info = env.step(msg)
    assert not info["action_valid"] and not info["action_effective"] and info["action"] is None
    assert error_part in info["error"]
    assert reward == pytest.approx(-0.1 - 0.15)
    assert not terminated and not truncated and env.text_env.grid_text() == before
    assert messages and all(m["content"].startswith("Error: ") for m in messages)
    for m in messages:
        assert m["role"] in ("tool", "user")
        assert (m["role"] == "tool") == ("tool_call_id" in m)


def test_every_call_with_an_id_gets_an_answer(env):
    messages, *_ = env.step(message(call("Right", "a"), call("Down", "b"), call("Up", None)))
    assert [m.get("tool_call_id") for m in messages] == ["a", "b", None]
    assert messages[-1]["role"] == "user"


def test_wraps_a_text_env_with_custom_penalty():
    tool_env = ToolEnv(TextEnv("arl/FrozenLake-v0", format_penalty=-0.2))
    tool_env.reset(seed=0)
    assert tool_env.game_name == "frozen_lake" and tool_env.format_penalty == pytest.approx(-0.2)
    _m, reward, *_rest = tool_env.step({"role": "assistant", "content": "hi"})
    assert reward == pytest.approx(-0.2)  # FrozenLake's no-op pays nothing else


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
DIRECTIONS = st.sampled_from(["Up", "down", "LEFT", " Right ", "north", ""])
CALL = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"id": st.one_of(st.text(max_size=8), JSON), "type": st.sampled_from(["function", "other"])},
        optional={
            "function": st.one_of(
                JSON,
                st.fixed_dictionaries(
                    {"name": st.sampled_from(["move", "Move", "jump"]) | JSON},
                    optional={
                        "arguments": st.one_of(
                            st.text(max_size=30),
                            JSON.map(json.dumps),
                            DIRECTIONS.map(lambda d: json.dumps({"direction": d})),
                            st.dictionaries(
                                st.sampled_from(["direction", "x"]), DIRECTIONS | JSON, max_size=2
                            ),
                        )
                    },
                ),
            )
        },
    ),
)
MESSAGE = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"role": st.just("assistant")},
        optional={
            "content": st.text(max_size=20) | st.none(),
            "tool_calls": st.lists(CALL, max_size=3) | JSON,
        },
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(MESSAGE, min_size=1, max_size=4))
def test_fuzzed_messages_never_raise(msgs):
    tool_env = ToolEnv("arl/Sokoban-v0")
    tool_env.reset(seed=0)
    for msg in msgs:
        messages, reward, terminated, truncated, info = tool_env.step(msg)
        assert isinstance(messages, list) and messages
        assert all(isinstance(m, dict) and isinstance(m["content"], str) for m in messages)
        assert isinstance(reward, float) and info["action_valid"] in (True, False)
        assert info["action_valid"] == (info["error"] is None)
        if terminated or truncated:
            tool_env.reset()


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), JSON.map(json.dumps)))
def test_fuzzed_argument_strings_never_raise(arguments):
    tool_env = ToolEnv("arl/FrozenLake-v0")
    tool_env.reset(seed=0)
    messages, _reward, _t, _tr, info = tool_env.step(message(call(None, "id", raw_arguments=arguments)))
    assert [m["tool_call_id"] for m in messages] == ["id"]
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    valid = (
        isinstance(parsed, dict)
        and set(parsed) == {"direction"}
        and isinstance(parsed["direction"], str)
        and parsed["direction"].strip().lower() in ("left", "down", "right", "up")
    )
    assert info["action_valid"] == valid
