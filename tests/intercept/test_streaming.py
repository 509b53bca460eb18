"""Streaming chat completions (``stream: true``): the chunks the stock `openai` client parses,
over loopback HTTP and in process, reassemble to exactly the non-streamed reply, and the tracked
tokens are exactly the engine's sampled ones."""

from __future__ import annotations

import json

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from arl.engine.scripted import ScriptedEngine
from arl.intercept import ChatHandler, InProcessClient, MessageTracker, ProxyServer, make_completion
from arl.intercept.client import ChunkStream
from arl.intercept.exchange import CHAT_PATH, answer
from arl.intercept.protocol import completion_chunks

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {
    "name": "move", "description": "Move.", "parameters": {"type": "object", "properties": {"d": {"type": "string"}}},
}}]
CALL = '<tool_call>{{"name": "move", "arguments": {{"d": "{}"}}}}</tool_call>'
SCRIPT = [
    "Hello there, é and <b>tags</b>.",
    "Let me move. " + CALL.format("Up") + CALL.format("Down"),
    CALL.format("Left"),
    "",
]
PROMPT = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]


class Episode:
    """One episode's handler on a scripted engine, remembering every Generation it got."""

    def __init__(self, tokenizer):
        self.engine = ScriptedEngine(tokenizer, responses=SCRIPT)
        self.tracker = MessageTracker(tokenizer)
        self.gens: list = []
        self.handler = ChatHandler(self.engine, self.tracker, generate=self._generate)

    async def _generate(self, prompt_ids, params):
        gen = await self.engine.generate(prompt_ids, params)
        self.gens.append(gen)
        return gen

    def assert_token_exact(self):
        """Every sample's response tokens are the engine's sampled tokens, log-probs included."""
        samples = self.tracker.step_samples()
        assert len(samples) == len(self.gens) == len(SCRIPT)
        for sample, gen in zip(samples, self.gens, strict=True):
            response = [t for t, m in zip(sample.input_ids, sample.response_mask, strict=True) if m]
            logprobs = [lp for lp, m in zip(sample.logprobs, sample.response_mask, strict=True) if m]
            assert response == list(gen.token_ids) and logprobs == list(gen.logprobs)


def reassemble(chunks) -> tuple[dict, list]:
    """The message a stream carries, by concatenating deltas by hand (what frameworks do)."""
    content, calls, finish, role = None, {}, None, None
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            role = delta.role or role
            if delta.content is not None:
                content = (content or "") + delta.content
            for call in delta.tool_calls or ():
                slot = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                if call.function is not None:
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    message = {"role": role, "content": content, "finish_reason": finish,
               "tool_calls": [calls[k] for k in sorted(calls)] or None}
    return message, [c for c in chunks if not c.choices]


def message_of(completion) -> dict:
    choice = completion.choices[0]
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
             for c in choice.message.tool_calls or ()] or None
    return {"role": choice.message.role, "content": choice.message.content, "finish_reason": choice.finish_reason,
            "tool_calls": calls}


async def play(create, stream: bool, **kw):
    """Four turns, each sending back the reply: a text, two tool calls, one tool call, an empty reply."""
    history, out = list(PROMPT), []
    for turn in range(len(SCRIPT)):
        if stream:
            chunks = [c async for c in await create(messages=history, tools=TOOLS, stream=True, **kw)]
            assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
            message, tail = reassemble(chunks)
            out.append((message, chunks, tail))
        else:
            completion = await create(messages=history, tools=TOOLS, **{k: v for k, v in kw.items()
                                                                        if k != "stream_options"})
            message = message_of(completion)
            out.append((message, completion, None))
        reply = {"role": "assistant", "content": message["content"]}
        if message["tool_calls"]:
            reply["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}}
                                   for c in message["tool_calls"]]
        history += [reply, *({"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                             for c in message["tool_calls"] or ())]
        if not message["tool_calls"]:
            history.append({"role": "user", "content": f"turn {turn}"})
    return out


async def test_stock_client_stream_over_http_reassembles_the_reply(tiny_tokenizer):
    plain, streamed = Episode(tiny_tokenizer), Episode(tiny_tokenizer)
    async with ProxyServer() as server:
        server.register("plain", plain.handler)
        server.register("streamed", streamed.handler)
        async with (openai.AsyncOpenAI(base_url=server.base_url, api_key="plain", max_retries=0) as a,
                    openai.AsyncOpenAI(base_url=server.base_url, api_key="streamed", max_retries=0) as b):
            expected = await play(a.chat.completions.create, stream=False, model="arl")
            got = await play(b.chat.completions.create, stream=True, model="arl",
                             stream_options={"include_usage": True})
        assert server.stats["streams"] == len(SCRIPT) and server.stats["errors"] == 0
    for (want, completion, _), (message, chunks, tail) in zip(expected, got, strict=True):
        assert message == want
        [usage] = tail  # include_usage: one last chunk, no choices, the usage
        assert chunks[-1] is usage and usage.usage == completion.usage
        assert all(c.usage is None for c in chunks[:-1])
    assert [m["finish_reason"] for m, _, _ in got] == ["stop", "tool_calls", "tool_calls", "stop"]
    assert [len(m["tool_calls"] or ()) for m, _, _ in got] == [0, 2, 1, 0]
    assert got[3][0]["content"] == ""  # an empty reply streams as "" (the role chunk), not None
    assert got[2][0]["content"] is None  # tool calls only: no content at all, as OpenAI sends it
    streamed.assert_token_exact()
    plain.assert_token_exact()
    assert [s.input_ids for s in streamed.tracker.traj_samples()] == [s.input_ids for s in plain.tracker.traj_samples()]
    assert streamed.tracker.stats["forks"] == 0 and streamed.tracker.stats["untracked_assistant"] == 0


async def test_stream_helper_final_completion_equals_the_plain_reply(tiny_tokenizer):
    """The `openai` package's own accumulator (``chat.completions.stream``) parses the events."""
    plain, streamed = Episode(tiny_tokenizer), Episode(tiny_tokenizer)
    plain.engine.responses = streamed.engine.responses = [SCRIPT[1]]
    async with ProxyServer() as server:
        server.register("p", plain.handler)
        server.register("s", streamed.handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="p", max_retries=0) as a:
            want = await a.chat.completions.create(model="arl", messages=PROMPT, tools=TOOLS, logprobs=True)
        async with (openai.AsyncOpenAI(base_url=server.base_url, api_key="s", max_retries=0) as b,
                    b.chat.completions.stream(model="arl", messages=PROMPT, tools=TOOLS, logprobs=True) as stream):
            kinds = [event.type async for event in stream]
            final = await stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds and "content.done" in kinds
    choice, expected = final.choices[0], want.choices[0]
    assert choice.finish_reason == expected.finish_reason == "tool_calls"
    assert choice.message.content == expected.message.content == "Let me move."
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        (c.id, c.function.name, c.function.arguments) for c in expected.message.tool_calls]
    assert [t.logprob for t in choice.logprobs.content] == [t.logprob for t in expected.logprobs.content]
    assert [t.logprob for t in choice.logprobs.content] == list(streamed.gens[0].logprobs)


async def test_in_process_stream_is_the_same_chunks(tiny_tokenizer):
    plain, streamed = Episode(tiny_tokenizer), Episode(tiny_tokenizer)
    expected = await play(InProcessClient(plain.handler, "p").chat.completions.create, stream=False)
    client = InProcessClient(streamed.handler, "s")
    got = await play(client.chat.completions.create, stream=True)
    assert [m for m, _, _ in got] == [m for m, _, _ in expected]
    assert all(tail == [] for _, _, tail in got)  # no usage chunk unless asked for
    streamed.assert_token_exact()
    # async with / close(), as with the stock AsyncStream; errors come from create() itself
    async with await client.chat.completions.create(messages=PROMPT, stream=True) as stream:
        assert isinstance(stream, ChunkStream)
        first = await stream.__anext__()
        assert first.choices[0].delta.role == "assistant"
    assert [c async for c in stream] == []
    client.handler.close()
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(messages=PROMPT, stream=True)
    assert info.value.status_code == 410


async def test_chunks_follow_openai_order_and_state_accumulator_agrees():
    completion = make_completion(
        completion_id="c", model="m", content="hi", finish_reason="tool_calls", prompt_tokens=3, completion_tokens=2,
        tool_calls=[{"id": "a", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "function": {"name": "g", "arguments": '{"x": 1}'}}],
        token_logprobs=[("h", -0.5), ("i", -0.25)],
    )
    chunks = completion_chunks(completion, include_usage=True)
    deltas = [c.choices[0].delta.model_dump(exclude_unset=True) if c.choices else None for c in chunks]
    assert deltas == [
        {"role": "assistant", "content": "", "refusal": None},
        {"content": "hi"},
        {"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
        {"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "g", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"x": 1}'}}]},
        {},
        None,
    ]
    assert [c.choices[0].finish_reason if c.choices else "usage" for c in chunks][-2:] == ["tool_calls", "usage"]
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    final = state.get_final_completion()
    assert final.choices[0].message.content == "hi" and final.usage == completion.usage
    assert [c.function.arguments for c in final.choices[0].message.tool_calls] == ["{}", '{"x": 1}']
    assert [t.logprob for t in final.choices[0].logprobs.content] == [-0.5, -0.25]


async def test_exchange_streams_for_pull_mode_too(tiny_tokenizer):
    """`answer` (pull mode's pipes) sends the same events as the server: SSE ending in [DONE]."""
    episode = Episode(tiny_tokenizer)
    body = json.dumps({"messages": PROMPT, "stream": True, "stream_options": {"include_usage": True}}).encode()
    status, raw = await answer(episode.handler, "e", "POST", CHAT_PATH, body)
    assert status == 200
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == SCRIPT[0]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(episode.gens[0].token_ids)
    status, raw = await answer(episode.handler, "e", "POST", CHAT_PATH, json.dumps({"messages": []}).encode())
    assert status == 400 and b"data:" not in raw  # a refused stream is a plain JSON error
