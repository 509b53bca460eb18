"""Every request field honoured or refused, never silently ignored: stop strings of any length,
parallel_tool_calls, refused constraints, counted no-ops, unknown routes and the model list; and
the agent process's telemetry switches."""

from __future__ import annotations

import logging

import aiohttp
import openai
import pytest

from arl.agents.process import TELEMETRY_OFF, agent_env
from arl.engine.scripted import ScriptedEngine
from arl.intercept import BadRequest, ChatHandler, InProcessClient, MessageTracker, ProxyServer, parse_request
from arl.intercept.exchange import answer

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {}}}}]
CALL = '<tool_call>{{"name": "move", "arguments": {{"d": "{}"}}}}</tool_call>'
SMOLAGENTS_STOPS = ["Observation:", "Calling tools:", "</code>"]


class Episode:
    def __init__(self, tokenizer, script):
        self.tokenizer = tokenizer
        self.engine = ScriptedEngine(tokenizer, responses=script)
        self.tracker = MessageTracker(tokenizer)
        self.gens: list = []
        self.params: list = []
        self.handler = ChatHandler(self.engine, self.tracker, generate=self._generate)
        self.client = InProcessClient(self.handler, "e")

    async def _generate(self, prompt_ids, params):
        self.params.append(params)
        gen = await self.engine.generate(prompt_ids, params)
        self.gens.append(gen)
        return gen

    def response(self, k: int = -1):
        """(response tokens, their log-probs, the tokens after them with mask 0) of request k's step sample."""
        sample = self.tracker.step_samples()[k]
        mask = sample.response_mask
        first = mask.index(1)
        last = len(mask) - mask[::-1].index(1)
        return sample.input_ids[first:last], sample.logprobs[first:last], sample.input_ids[last:]


def decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=True)


# -- stop strings ---------------------------------------------------------------------------------


async def test_multi_token_stop_strings_cut_at_the_completing_token(tiny_tokenizer):
    assert all(len(tiny_tokenizer.encode(s, add_special_tokens=False)) > 1 for s in SMOLAGENTS_STOPS)
    script = ["Thought: look.\nCode:\n```py\nprint(1)\n```</code>\nObservation: 1\nmore text"]
    ep = Episode(tiny_tokenizer, script)
    out = await ep.client.chat.completions.create(messages=MESSAGES, stop=SMOLAGENTS_STOPS)
    choice = out.choices[0]
    assert choice.message.content == "Thought: look.\nCode:\n```py\nprint(1)\n```"
    assert choice.finish_reason == "stop"
    sampled = list(ep.gens[0].token_ids)
    ids, logprobs, after = ep.response()
    k = len(ids)
    assert ids == sampled[:k] and logprobs == list(ep.gens[0].logprobs[:k])  # a prefix of the sampled tokens
    assert "</code>" in decode(tiny_tokenizer, sampled[:k]) and "</code>" not in decode(tiny_tokenizer, sampled[: k - 1])
    assert after == ep.tracker.end_of_turn_ids  # the template's end-of-turn follows, mask 0
    assert out.usage.completion_tokens == k and ep.handler.stats["stop_cuts"] == 1
    assert ep.tracker.requests[0].finish_reason == "stop"
    # the agent sends the cut reply back: it is the tracked message (no fork, no untracked assistant)
    await ep.client.chat.completions.create(
        messages=[*MESSAGES, choice.message, {"role": "user", "content": "next"}], stop=SMOLAGENTS_STOPS)
    assert ep.tracker.stats["forks"] == 0 and ep.tracker.stats["untracked_assistant"] == 0
    [traj] = ep.tracker.traj_samples()
    assert sum(traj.response_mask) == k + len(ep.response()[0])


async def test_stop_strings_first_match_wins_and_reach_the_engine(tiny_tokenizer):
    ep = Episode(tiny_tokenizer, ["alpha beta gamma delta"])
    out = await ep.client.chat.completions.create(messages=MESSAGES, stop=["delta", "beta g"])
    assert out.choices[0].message.content == "alpha "  # "beta g" completes before "delta"
    assert out.choices[0].finish_reason == "stop"
    assert ep.params[0].stop == ("delta", "beta g")  # the engine stops there itself (arl.engine.stops)
    [newline] = tiny_tokenizer.encode("\n", add_special_tokens=False)
    ep = Episode(tiny_tokenizer, ["alpha\nbeta"])
    out = await ep.client.chat.completions.create(messages=MESSAGES, stop="\n")
    assert ep.params[0].stop == ("\n",) and ep.gens[0].token_ids[-1] == newline
    assert out.choices[0].message.content == "alpha" and ep.response()[0] == list(ep.gens[0].token_ids)
    ep = Episode(tiny_tokenizer, ["no match here"])
    out = await ep.client.chat.completions.create(messages=MESSAGES, stop=["zebra"])
    assert out.choices[0].message.content == "no match here" and ep.handler.stats["stop_cuts"] == 0
    assert ep.response()[0] == list(ep.gens[0].token_ids)


async def test_stop_match_in_a_reply_cut_at_max_tokens_finishes_with_stop(tiny_tokenizer):
    ep = Episode(tiny_tokenizer, ["one two three four five six seven eight nine ten"])
    out = await ep.client.chat.completions.create(messages=MESSAGES, stop=["two"], max_tokens=6)
    assert ep.gens[0].finish_reason == out.choices[0].finish_reason == "stop"
    assert out.choices[0].message.content == "one "


@pytest.mark.parametrize("stop", ["", [""], ["ok", 3], 7])
def test_bad_stop_values_are_refused(stop):
    with pytest.raises(BadRequest) as info:
        parse_request({"messages": MESSAGES, "stop": stop})
    assert info.value.param == "stop"


# -- parallel_tool_calls ---------------------------------------------------------------------------


async def test_parallel_tool_calls_false_keeps_the_first_call_and_its_tokens(tiny_tokenizer):
    script = ["Moving. " + CALL.format("Up") + " then " + CALL.format("Down")]
    ep = Episode(tiny_tokenizer, script)
    out = await ep.client.chat.completions.create(messages=MESSAGES, tools=TOOLS, parallel_tool_calls=False)
    message = out.choices[0].message
    assert [c.function.arguments for c in message.tool_calls] == ['{"d": "Up"}']
    assert message.content == "Moving." and out.choices[0].finish_reason == "tool_calls"
    ids, _, after = ep.response()
    assert ids == list(ep.gens[0].token_ids[: len(ids)]) and len(ids) < len(ep.gens[0].token_ids)
    assert decode(tiny_tokenizer, ids).endswith("</tool_call>") and after == ep.tracker.end_of_turn_ids
    assert ep.handler.stats["parallel_tool_calls_cut"] == 1
    for allowed in (True, None):
        ep = Episode(tiny_tokenizer, script)
        out = await ep.client.chat.completions.create(messages=MESSAGES, tools=TOOLS, parallel_tool_calls=allowed)
        assert len(out.choices[0].message.tool_calls) == 2
        assert ep.response()[0] == list(ep.gens[0].token_ids)


# -- refused fields, no-ops, unknown fields ----------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("response_format", "json"),
    ("response_format", {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}),  # no name
    ("tool_choice", {"type": "function", "function": {"name": "jump"}}),  # not among the tools
    ("tool_choice", {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}),
    ("tool_choice", "sometimes"),
    ("frequency_penalty", 0.5), ("presence_penalty", -1), ("logit_bias", {"5": 10}), ("top_logprobs", 3),
    ("guided_json", {"type": "object"}), ("functions", [{"name": "f"}]), ("modalities", ["text", "audio"]),
    ("parallel_tool_calls", "no"), ("stream_options", {"include_usage": "yes"}),
])
async def test_refused_and_malformed_fields_get_a_400_naming_them(field, value):
    with pytest.raises(BadRequest) as info:
        parse_request({"messages": MESSAGES, "tools": TOOLS, field: value})
    assert info.value.param == field and field in info.value.message and info.value.status == 400


@pytest.mark.parametrize("field, value", [
    ("response_format", {"type": "text"}), ("tool_choice", "auto"), ("tool_choice", "none"),
    ("frequency_penalty", 0), ("presence_penalty", 0.0), ("logit_bias", {}), ("top_logprobs", 0),
    ("modalities", ["text"]), ("parallel_tool_calls", True), ("user", "me"), ("store", False),
    ("metadata", {"k": "v"}), ("stream_options", {"include_usage": True}),
])
def test_harmless_values_are_accepted(field, value):
    request = parse_request({"messages": MESSAGES, "tools": TOOLS, field: value})
    assert request.noop == request.unknown == () and not request.include_usage  # not streaming


async def test_reasoning_fields_are_counted_noops_and_logged_once(tiny_tokenizer, caplog):
    from arl.intercept import handler as handler_module

    handler_module._WARNED.clear()
    caplog.set_level(logging.WARNING, logger="arl.intercept")
    ep = Episode(tiny_tokenizer, ["fine"])
    async with ProxyServer() as server:
        server.register("tok", ep.handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            for _ in range(2):
                out = await client.chat.completions.create(
                    model="arl", messages=MESSAGES, reasoning_effort="high", verbosity="low",
                    extra_body={"chat_template_kwargs": {"x": 1}})
                assert out.choices[0].message.content == "fine"
        stats = server.stats
    assert stats["noop_fields"] == 4 and stats["noop_field:reasoning_effort"] == stats["noop_field:verbosity"] == 2
    assert stats["unknown_fields"] == 2 and stats["unknown_field:chat_template_kwargs"] == 2
    assert ep.handler.stats["noop_fields"] == 4 and ep.handler.stats["unknown_fields"] == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 3 and sum("reasoning_effort" in m for m in warned) == 1  # once per field name
    request = parse_request({"messages": MESSAGES, "reasoning_effort": "low", "weird": 1, "user": "u"})
    assert request.noop == ("reasoning_effort",) and request.unknown == ("weird",)
    assert request.extra == {"reasoning_effort": "low", "weird": 1, "user": "u"}


# -- routes -----------------------------------------------------------------------------------------


async def test_unknown_paths_list_the_endpoints_and_are_counted_and_logged(caplog):
    caplog.set_level(logging.WARNING, logger="arl.intercept")

    async def handler(episode_key, request):
        raise AssertionError("never called")

    async with ProxyServer(model_name="policy") as server, aiohttp.ClientSession() as s:
        server.register("tok", handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            for _ in range(2):
                with pytest.raises(openai.NotFoundError) as info:
                    await client.embeddings.create(model="policy", input="hi")
                message = info.value.body["message"]
                assert "/v1/embeddings" in message and "POST /v1/chat/completions" in message
                assert "POST /v1/responses" in message
                assert "GET /v1/models" in message and info.value.body["code"] == "unknown_endpoint"
            assert [m.id for m in (await client.models.list()).data] == ["policy"]
            assert (await client.models.retrieve("policy")).id == "policy"
            with pytest.raises(openai.NotFoundError):
                await client.models.retrieve("gpt-4o")
        async with s.get(f"{server.base_url}/chat/completions") as r:
            assert r.status == 405 and "POST" in (await r.json())["error"]["message"]
        async with s.delete(f"http://127.0.0.1:{server.port}/") as r:
            assert r.status == 404 and "POST /v1/chat/completions" in (await r.json())["error"]["message"]
        assert server.stats["unknown_paths"] == 3 and server.stats["requests"] == 7
        assert server.stats["errors"] == 5
    logged = [r.getMessage() for r in caplog.records if "not an endpoint" in r.getMessage()]
    assert len(logged) == 2 and "/v1/embeddings" in logged[0]  # once per route


async def test_trailing_slash_and_pull_mode_routes(tiny_tokenizer):
    ep = Episode(tiny_tokenizer, ["ok"])
    async with ProxyServer() as server, aiohttp.ClientSession() as s:
        server.register("tok", ep.handler)
        async with s.post(f"{server.base_url}/chat/completions/", json={"messages": MESSAGES},
                          headers={"Authorization": "Bearer tok"}) as r:
            assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"] == "ok"
        assert server.stats["requests"] == 1
    status, raw = await answer(ep.handler, "e", "POST", "/v1/embeddings", b"{}")
    assert status == 404 and b"POST /v1/chat/completions" in raw
    status, raw = await answer(ep.handler, "e", "GET", "/v1/models/arl", b"")
    assert status == 200 and b'"id": "arl"' in raw


# -- push mode's environment -------------------------------------------------------------------------


def test_agent_processes_start_with_framework_telemetry_off(monkeypatch):
    env = agent_env((), {}, {"OPENAI_API_KEY": "tok"})
    assert env["OPENAI_AGENTS_DISABLE_TRACING"] == "1" and env["LANGCHAIN_TRACING_V2"] == "false"
    assert env["HF_HUB_DISABLE_TELEMETRY"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["ANONYMIZED_TELEMETRY"] == "False" and set(TELEMETRY_OFF) <= set(env)
    # the caller's environment wins: env_extra, or an inherited variable named in inherit_env
    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    env = agent_env(("LANGSMITH_TRACING",), {"OPENAI_AGENTS_DISABLE_TRACING": "0"}, {})
    assert env["OPENAI_AGENTS_DISABLE_TRACING"] == "0" and env["LANGSMITH_TRACING"] == "true"
