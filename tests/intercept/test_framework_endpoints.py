"""What agent frameworks meet with their default settings (issue 47 §D): the OpenAI routes they
call that arl does not serve answer with what to use instead, and push mode switches their
telemetry and downloads off in every agent's environment, each overridable."""

from __future__ import annotations

import json
import logging
import sys
import textwrap

import openai
import pytest

from arl.agents import PushModeRunner
from arl.agents.process import NETWORK_OFF, TELEMETRY_OFF
from arl.config import ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.intercept import ChatHandler, MessageTracker, ProxyServer
from arl.intercept.exchange import answer
from arl.rollout import EpisodeSpec
from arl.rollout.proxy import ProxyEnvManager

pytestmark = pytest.mark.anyio


async def never_called(episode_key, request):
    raise AssertionError("the handler must not be called")


# -- /v1/completions: refused with the fix, not served ----------------------------------------------


async def test_legacy_completions_names_the_chat_endpoint_and_the_llamaindex_flags(caplog):
    """LlamaIndex's OpenAILike (is_chat_model False by default) calls POST /v1/completions; arl does not
    serve it (a raw-text prompt cannot be tracked token-exact), and the 404 says what to do instead."""
    caplog.set_level(logging.WARNING, logger="arl.intercept.server")
    async with ProxyServer(model_name="policy") as server:
        server.register("tok", never_called)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            with pytest.raises(openai.NotFoundError) as info:
                await client.completions.create(model="policy", prompt="Thought: I", max_tokens=8)
    message = info.value.body["message"]
    assert "is_chat_model=True" in message and "is_function_calling_model=True" in message
    assert "use POST /v1/chat/completions" in message and info.value.body["code"] == "unknown_endpoint"
    assert server.stats["unknown_paths"] == 1 and server.stats["errors"] == 1
    assert any("is_chat_model=True" in r.getMessage() for r in caplog.records)  # the log says it too
    # pull mode's transport answers the same
    status, raw = await answer(never_called, "e", "POST", "/v1/completions", b'{"prompt": "hi"}')
    assert status == 404 and json.loads(raw)["error"]["message"] == message


# -- the Conversations API: both refusals name previous_response_id ------------------------------------


async def test_conversations_refusals_name_previous_response_id(tiny_tokenizer):
    tracker = MessageTracker(tiny_tokenizer)
    handler = ChatHandler(ScriptedEngine(tiny_tokenizer, responses=["one", "two"]), tracker)
    async with ProxyServer(model_name="policy") as server:
        server.register("tok", handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            with pytest.raises(openai.NotFoundError) as info:  # POST /v1/conversations
                await client.conversations.create(items=[{"type": "message", "role": "user", "content": "hi"}])
            assert "previous_response_id" in info.value.body["message"]
            with pytest.raises(openai.NotFoundError) as info:  # and every route under it
                await client.conversations.items.list("conv_1")
            assert "previous_response_id" in info.value.body["message"]
            with pytest.raises(openai.BadRequestError) as info:  # a Responses request naming a conversation
                await client.responses.create(model="policy", input="hi", conversation="conv_1")
            message = info.value.body["message"]
            assert "Conversations API" in message and "previous_response_id" in message
            assert info.value.body["param"] == "conversation"
            # the alternative the messages name: the episode keeps its responses, so a chain works
            first = await client.responses.create(model="policy", input="hi")
            second = await client.responses.create(model="policy", input="more", previous_response_id=first.id)
    assert (first.output_text, second.output_text) == ("one", "two")
    assert len(tracker.traj_samples()) == 1  # one conversation: the chain continued its branch


# -- push mode's environment: the frameworks' switches, the user's value wins ------------------------

NEW_DEFAULTS = {"AGNO_TELEMETRY": "false", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_CONFIGURED": "true",
                "CREWAI_TRACING_ENABLED": "false", "AUTOGEN_DISABLE_RUNTIME_TRACING": "true",
                "LANGCHAIN_TRACING_V2": "false", "CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true"}

# Reports the variables it is given in its result's `error` after one model call (a Finished
# episode keeps it): what the agent process's environment held.
ENV_PROBE = textwrap.dedent("""
    import json, os, sys, openai
    from arl.agents.process import write_result
    seen = {k: os.environ.get(k) for k in json.loads(sys.argv[1])}
    openai.OpenAI().chat.completions.create(model=os.environ["ARL_MODEL"], messages=[{"role": "user", "content": "hi"}])
    write_result({"score": 1.0, "error": json.dumps(seen)})
""")


async def probe_env(tokenizer, **runner_kwargs) -> dict[str, str | None]:
    command = [sys.executable, "-c", ENV_PROBE, json.dumps(sorted(NEW_DEFAULTS))]
    factory = lambda client, s, config: PushModeRunner(client, command, timeout_s=60, **runner_kwargs)  # noqa: E731
    async with ProxyEnvManager(ScriptedEngine(tokenizer), ManagerConfig(max_tokens=16), factory, transport="http",
                               granularity="traj") as manager:
        episode = await manager.run_episode(EpisodeSpec("arl/FrozenLake-v0", 4, "train_0_4", 0))
    assert episode.trajectory.status == "Finished", episode.trajectory.error
    return json.loads(episode.trajectory.error)


async def test_push_agents_start_with_the_frameworks_switches_off(tiny_tokenizer):
    assert set(NEW_DEFAULTS) <= {*TELEMETRY_OFF, *NETWORK_OFF}
    assert await probe_env(tiny_tokenizer) == NEW_DEFAULTS


async def test_a_users_value_overrides_each_switch(tiny_tokenizer, monkeypatch):
    monkeypatch.setenv("AGNO_TELEMETRY", "true")  # inherited by name (inherit_env)
    env = await probe_env(tiny_tokenizer, inherit_env=("AGNO_TELEMETRY",),
                          env_extra={"LITELLM_LOCAL_MODEL_COST_MAP": "False", "MSWEA_COST_TRACKING": "default"})
    assert env == {**NEW_DEFAULTS, "AGNO_TELEMETRY": "true", "LITELLM_LOCAL_MODEL_COST_MAP": "False",
                   "MSWEA_COST_TRACKING": "default"}


async def test_push_agents_find_the_proxy_under_the_older_name_too(tiny_tokenizer):
    """LlamaIndex's OpenAI / OpenAILike read ``OPENAI_API_BASE``, not ``OPENAI_BASE_URL``: without
    it, a push-mode LlamaIndex agent with its defaults sends the episode's prompts (and key) to
    api.openai.com. Push mode sets both to the proxy's address."""
    names = {"OPENAI_BASE_URL": None, "OPENAI_API_BASE": None}
    command = [sys.executable, "-c", ENV_PROBE, json.dumps(sorted(names))]
    factory = lambda client, s, config: PushModeRunner(client, command, timeout_s=60)  # noqa: E731
    async with ProxyEnvManager(ScriptedEngine(tiny_tokenizer), ManagerConfig(max_tokens=16), factory,
                               transport="http", granularity="traj") as manager:
        episode = await manager.run_episode(EpisodeSpec("arl/FrozenLake-v0", 4, "train_0_4", 0))
        address = manager.server.base_url
    assert episode.trajectory.status == "Finished", episode.trajectory.error
    assert json.loads(episode.trajectory.error) == {"OPENAI_BASE_URL": address, "OPENAI_API_BASE": address}
