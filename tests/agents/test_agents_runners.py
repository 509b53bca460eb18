"""GymRunner / ToolCallRunner against a duck-typed client: the conversation they send, and how
they report env and model-call failures."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from arl.agents import EpisodeResult, GymRunner, ToolCallRunner
from arl.envs.prompts import traj_messages_start, traj_user_message
from arl.envs.text import TextEnv

pytestmark = pytest.mark.anyio


class FakeClient:
    """Records every call; replies from a list of (content, tool_calls) or raises."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls: list[dict] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, **kwargs):
        self.calls.append({**kwargs, "messages": [dict(m) for m in kwargs["messages"]]})
        reply = self.replies[(len(self.calls) - 1) % len(self.replies)]
        if isinstance(reply, Exception):
            raise reply
        content, calls = reply if isinstance(reply, tuple) else (reply, None)
        tool_calls = None
        if calls:
            tool_calls = [SimpleNamespace(model_dump=lambda exclude_none=True, c=c: c) for c in calls]
        message = SimpleNamespace(content=content, tool_calls=tool_calls)
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


async def test_gym_runner_sends_the_trajectory_conversation():
    client = FakeClient(["<answer>Up</answer>", "nonsense", "<answer>Left</answer>"])
    runner = GymRunner(client, "arl/Sokoban-v0", max_tokens=17, temperature=0.7, top_p=0.9, max_turns=4,
                       extra_body={"top_k": 3})
    result = await runner.run_job(5)
    assert result.status == "Finished" and result.exit_reason == "truncated"
    assert len(client.calls) == 4 and len(result.step_scores) == 4
    assert result.score == pytest.approx(sum(result.step_scores))
    assert [i["action_valid"] for i in result.step_infos] == [True, False, True, True]
    # Rebuild what TrajEnvManager renders for this episode (limit = min(max_turns, env limit)).
    env = TextEnv("arl/Sokoban-v0")
    obs, _ = env.reset(seed=5)
    expected = traj_messages_start(obs, 4, 17, env.instructions)
    for k, reply in enumerate(["<answer>Up</answer>", "nonsense", "<answer>Left</answer>"]):
        assert client.calls[k]["messages"] == expected
        expected = [*expected, {"role": "assistant", "content": reply}]
        obs, *_ = env.step(reply)
        expected.append({"role": "user", "content": traj_user_message(k + 2, obs, 4 - k - 1, 17)})
    first = client.calls[0]
    assert (first["max_tokens"], first["temperature"], first["top_p"], first["extra_body"]) == (17, 0.7, 0.9, {"top_k": 3})


async def test_env_error_is_reported():
    client = FakeClient(["<answer>Up</answer>"])
    result = await GymRunner(client, "arl/NoSuchEnv-v0").run_job(0)
    assert (result.status, result.exit_reason) == ("Failed", "env_error") and "NoSuchEnv" in result.error
    assert client.calls == []


class ApiError(Exception):
    def __init__(self, status_code=None, code=None):
        super().__init__(f"status {status_code} code {code}")
        self.status_code, self.code = status_code, code


@pytest.mark.parametrize(
    "error, expected",
    [
        (ApiError(400, "context_length_exceeded"), ("Finished", "max_length")),
        (ApiError(500, "engine_error"), ("Failed", "engine_error")),
        (ConnectionError("refused"), ("Failed", "engine_error")),
        (ApiError(404, "unknown_episode_key"), ("Failed", "agent_error")),
    ],
)
async def test_model_call_failures_are_reported_with_partial_score(error, expected):
    client = FakeClient(["<answer>Up</answer>", error])
    result = await GymRunner(client, "arl/FrozenLake-v0").run_job(1)
    if len(client.calls) == 1:  # the first move ended the game
        pytest.skip("episode ended before the failing call")
    assert (result.status, result.exit_reason) == expected
    assert len(result.step_scores) == 1 and result.score == result.step_scores[0]


async def test_tool_call_runner_feeds_tool_calls_and_replies():
    call = {"id": "call_0", "type": "function", "function": {"name": "move", "arguments": json.dumps({"direction": "Up"})}}
    client = FakeClient([(None, [call]), ("no tools", None)])
    result = await ToolCallRunner(client, "arl/Sokoban-v0", max_turns=3).run_job(2)
    assert isinstance(result, EpisodeResult) and result.status == "Finished"
    assert client.calls[0]["tools"][0]["function"]["name"] == "move"
    second = client.calls[1]["messages"]
    assert second[2] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == "call_0"
    third = client.calls[2]["messages"]
    assert third[4] == {"role": "assistant", "content": "no tools"}
    assert third[5]["role"] == "user" and "Error" in third[5]["content"]  # the env explains the invalid turn
    assert [i["action_valid"] for i in result.step_infos] == [True, False, True]


def test_episode_result_json_round_trip():
    result = EpisodeResult(status="Timeout", score=1.5, step_scores=[1, 0.5], exit_reason="timeout",
                           metrics={"n": 2}, step_infos=[{"action": "Up"}])
    again = EpisodeResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result
    with pytest.raises((TypeError, ValueError)):
        EpisodeResult.from_json({"status": "Weird"})
    with pytest.raises(TypeError):
        EpisodeResult.from_json([1, 2])
