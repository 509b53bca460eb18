"""The Responses API (``POST /v1/responses``, ``client.responses.create``): the stock `openai`
client over loopback HTTP and the in-process client, plain and streamed, with tool calls, with and
without ``previous_response_id``; the tracked tokens are exactly the sampled ones, and an episode
played through the Responses API gives the same samples as the same episode through chat
completions."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseOutputMessage

from arl.engine import OutputConstraint
from arl.engine.scripted import ScriptedEngine
from arl.intercept import ChatHandler, InProcessClient, MessageTracker, ProxyServer
from arl.intercept.exchange import answer
from arl.intercept.protocol import output_constraint
from arl.intercept.responses import input_messages, parse_responses_request
from arl.intercept.toolcalls import tool_call_tag

pytestmark = pytest.mark.anyio

CALL = '<tool_call>{{"name": "move", "arguments": {{"d": "{}"}}}}</tool_call>'
SCRIPT = ["Hello there, é.", "Let me move. " + CALL.format("Up") + CALL.format("Down"), CALL.format("Left"), "done"]
INSTRUCTIONS = "You move."
RESPONSE_TOOLS = [{"type": "function", "name": "move", "description": "Move.", "strict": True,
                   "parameters": {"type": "object", "properties": {"d": {"type": "string"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in RESPONSE_TOOLS[0].items() if k not in ("type", "strict")}}]


class Episode:
    def __init__(self, tokenizer, script=SCRIPT):
        self.engine = ScriptedEngine(tokenizer, responses=script)
        self.tracker = MessageTracker(tokenizer)
        self.gens: list = []
        self.handler = ChatHandler(self.engine, self.tracker, generate=self._generate)
        self.client = InProcessClient(self.handler, "e")

    async def _generate(self, prompt_ids, params):
        gen = await self.engine.generate(prompt_ids, params)
        self.gens.append(gen)
        return gen

    def assert_token_exact(self):
        samples = self.tracker.step_samples()
        assert len(samples) == len(self.gens)
        for sample, gen in zip(samples, self.gens, strict=True):
            response = [t for t, m in zip(sample.input_ids, sample.response_mask, strict=True) if m]
            logprobs = [lp for lp, m in zip(sample.logprobs, sample.response_mask, strict=True) if m]
            assert response == list(gen.token_ids) and logprobs == list(gen.logprobs)

    def samples(self):
        return ([(s.input_ids, s.response_mask, s.logprobs) for s in self.tracker.traj_samples()],
                [(s.input_ids, s.response_mask, s.logprobs) for s in self.tracker.step_samples()])


def calls_of(response) -> list:
    return [item for item in response.output if item.type == "function_call"]


def new_items(response, turn: int) -> list[dict]:
    """What the agent answers a response with: each call's output, or a user message."""
    calls = calls_of(response)
    if calls:
        return [{"type": "function_call_output", "call_id": c.call_id, "output": f"moved {turn}"} for c in calls]
    return [{"role": "user", "content": f"turn {turn}"}]


async def play_responses(create, *, chained: bool, stream: bool = False, **kw):
    """The script's four turns through the Responses API: with previous_response_id (only the new
    items sent), or re-sending the whole conversation (store: false)."""
    history: list = [{"role": "user", "content": "go"}]
    items: list = list(history)
    previous, out = None, []
    for turn in range(len(SCRIPT)):
        args = dict(model="arl", instructions=INSTRUCTIONS, tools=RESPONSE_TOOLS, **kw)
        if chained:
            args.update(input=items, previous_response_id=previous)
        else:
            args.update(input=history, store=False)
        if stream:
            events = [e async for e in await create(stream=True, **args)]
            response = events[-1].response
            out.append((response, events))
        else:
            response = await create(**args)
            out.append((response, None))
        assert isinstance(response, Response)
        items = new_items(response, turn)
        history += [*response.output, *items]  # output items as the client got them (pydantic models)
        previous = response.id
    return out


async def play_chat(create):
    """The same four turns through chat completions."""
    history, out = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "go"}], []
    for turn in range(len(SCRIPT)):
        completion = await create(model="arl", messages=history, tools=CHAT_TOOLS)
        message = completion.choices[0].message
        history.append(message)
        out.append(completion)
        for call in message.tool_calls or ():
            history.append({"role": "tool", "tool_call_id": call.id, "content": f"moved {turn}"})
        if not message.tool_calls:
            history.append({"role": "user", "content": f"turn {turn}"})
    return out


def check_outputs(responses, chats):
    """Each response carries its chat completion's reply: text, then the calls (ids included)."""
    for response, completion in zip(responses, chats, strict=True):
        message = completion.choices[0].message
        texts = [item for item in response.output if item.type == "message"]
        if message.content:
            [item] = texts
            assert isinstance(item, ResponseOutputMessage) and item.content[0].text == message.content
            assert response.output_text == message.content
        else:
            assert not texts
        calls = calls_of(response)
        assert all(isinstance(c, ResponseFunctionToolCall) for c in calls)
        assert [(c.call_id, c.name, c.arguments) for c in calls] == [
            (t.id, t.function.name, t.function.arguments) for t in message.tool_calls or ()]
        assert response.status == "completed" and response.usage.input_tokens == completion.usage.prompt_tokens
        assert response.usage.output_tokens == completion.usage.completion_tokens


@pytest.mark.parametrize("chained", [True, False])
async def test_stock_client_over_http_matches_the_chat_episode(tiny_tokenizer, chained):
    chat, resp = Episode(tiny_tokenizer), Episode(tiny_tokenizer)
    async with ProxyServer() as server:
        server.register("chat", chat.handler)
        server.register("resp", resp.handler)
        async with (openai.AsyncOpenAI(base_url=server.base_url, api_key="chat", max_retries=0) as a,
                    openai.AsyncOpenAI(base_url=server.base_url, api_key="resp", max_retries=0) as b):
            chats = await play_chat(a.chat.completions.create)
            responses = [r for r, _ in await play_responses(b.responses.create, chained=chained)]
        assert server.stats["errors"] == 0
        assert server.stats["noop_field:tools.strict"] == len(SCRIPT)  # strict: counted, not enforced
    check_outputs(responses, chats)
    assert [len(calls_of(r)) for r in responses] == [0, 2, 1, 0]
    resp.assert_token_exact()
    assert resp.samples() == chat.samples()
    assert resp.tracker.stats["forks"] == 0 and resp.tracker.stats["untracked_assistant"] == 0
    assert len(resp.tracker.traj_samples()) == 1  # one token-exact chain
    assert len(resp.handler.responses) == (len(SCRIPT) if chained else 0)  # store: false keeps none


@pytest.mark.parametrize("chained", [True, False])
async def test_in_process_client_matches_http(tiny_tokenizer, chained):
    http, local = Episode(tiny_tokenizer), Episode(tiny_tokenizer)
    async with ProxyServer() as server:
        server.register("tok", http.handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            over_http = await play_responses(client.responses.create, chained=chained)
    in_process = await play_responses(local.client.responses.create, chained=chained)
    for (a, _), (b, _) in zip(over_http, in_process, strict=True):
        assert type(a) is type(b)
        drop = {"id", "created_at", "completed_at", "previous_response_id", "output"}
        assert a.model_dump(exclude=drop) == b.model_dump(exclude=drop)
        assert [o.model_dump(exclude={"id"}) for o in a.output] == [o.model_dump(exclude={"id"}) for o in b.output]
    local.assert_token_exact()
    assert local.samples() == http.samples()


@pytest.mark.parametrize("where", ["http", "inprocess"])
async def test_streamed_events_carry_the_plain_response(tiny_tokenizer, where):
    plain, streamed = Episode(tiny_tokenizer), Episode(tiny_tokenizer)
    async with ProxyServer() as server:
        server.register("tok", streamed.handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            create = client.responses.create if where == "http" else streamed.client.responses.create
            got = await play_responses(create, chained=True, stream=True)
        assert server.stats["streams"] == (len(SCRIPT) if where == "http" else 0)
    expected = await play_responses(plain.client.responses.create, chained=True)
    for (response, events), (want, _) in zip(got, expected, strict=True):
        types = [e.type for e in events]
        assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[0].response.status == "in_progress" and events[0].response.output == []
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == want.output_text
        assert [e.text for e in events if e.type == "response.output_text.done"] == ([want.output_text] if text else [])
        args = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
        assert args == [c.arguments for c in calls_of(want)]
        done = [e.item for e in events if e.type == "response.output_item.done"]
        added = [e.type for e in events if e.type == "response.output_item.added"]
        assert len(added) == len(done) == len(want.output)
        assert [d.model_dump(exclude={"id"}) for d in done] == [o.model_dump(exclude={"id"}) for o in want.output]
        assert [o.model_dump(exclude={"id"}) for o in response.output] == [o.model_dump(exclude={"id"}) for o in want.output]
    streamed.assert_token_exact()
    assert streamed.samples() == plain.samples()


async def test_stream_helper_accumulates_the_events(tiny_tokenizer):
    """openai's own `responses.stream()` helper checks the event order while it accumulates."""
    ep = Episode(tiny_tokenizer)
    async with ProxyServer() as server:
        server.register("tok", ep.handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            finals = []
            previous, items = None, [{"role": "user", "content": "go"}]
            for turn in range(2):
                async with client.responses.stream(model="arl", input=items, tools=RESPONSE_TOOLS,
                                                   instructions=INSTRUCTIONS, previous_response_id=previous) as s:
                    deltas = [e.delta async for e in s if e.type == "response.output_text.delta"]
                    final = await s.get_final_response()
                finals.append(final)
                assert "".join(deltas) == final.output_text
                previous, items = final.id, new_items(final, turn)
    assert finals[0].output_text == SCRIPT[0]
    assert [c.name for c in calls_of(finals[1])] == ["move", "move"]
    ep.assert_token_exact()
    assert ep.tracker.stats["forks"] == 0


async def test_max_output_tokens_gives_an_incomplete_response(tiny_tokenizer):
    ep = Episode(tiny_tokenizer, ["one two three four five six seven eight nine ten"])
    response = await ep.client.responses.create(model="arl", input="hi", max_output_tokens=3, temperature=0.5,
                                                top_p=0.9, include=["message.output_text.logprobs"])
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.max_output_tokens == 3
    assert response.temperature == 0.5 and response.top_p == 0.9
    assert [lp.logprob for lp in response.output[0].content[0].logprobs] == list(ep.gens[0].logprobs)
    ep.assert_token_exact()
    events = [e async for e in await ep.client.responses.create(model="arl", input="hi", max_output_tokens=3,
                                                                stream=True)]
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"


# -- conversion and refusals --------------------------------------------------------------------


def test_input_items_become_chat_messages():
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "t", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1", "status": "completed"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "r1"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "r2"}]},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
    ]
    assert input_messages(items) == [
        {"role": "developer", "content": "d"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "t", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    ]
    assert input_messages("hi") == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text", "needs a string 'name'"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text", "'json_schema'"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"input": "x", "tools": RESPONSE_TOOLS, "tool_choice": {"type": "function", "name": "jump"}}, "tool_choice",
     "'jump'"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]", "function tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0]", "text parts"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "'reasoning'"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id", "resp_nope"),
    ({"input": "x", "background": True}, "background", "not supported"),
    ({"input": "x", "truncation": "auto"}, "truncation", "never drops"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs", "sampled token"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({"instructions": "only"}, "input", "required"),
])
async def test_refused_fields_get_a_400_naming_them(tiny_tokenizer, body, param, words):
    ep = Episode(tiny_tokenizer)
    with pytest.raises(openai.BadRequestError) as info:
        await ep.client.responses.create(model="arl", **body)
    assert info.value.body["param"] == param and words in info.value.body["message"]
    status, raw = await answer(ep.handler, "e", "POST", "/v1/responses", json.dumps(body).encode())
    assert status == 400 and json.loads(raw)["error"]["param"] == param
    assert ep.gens == []


@pytest.mark.parametrize(("body", "kind", "spec"), [
    ({"text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}}},
     "json_schema", {"type": "object"}),
    ({"text": {"format": {"type": "json_object"}}}, "json_object", None),
    ({"tools": RESPONSE_TOOLS, "tool_choice": {"type": "function", "name": "move"}}, "structural_tag",
     tool_call_tag(CHAT_TOOLS, "move")),
])
def test_output_formats_and_forced_tools_become_the_chat_constraint(body, kind, spec):
    request = parse_responses_request({"input": "x", **body})
    assert output_constraint(request.chat) == OutputConstraint(kind, spec)
    assert output_constraint(request.chat).spec == spec


def test_noops_are_named_for_counting():
    request = parse_responses_request({"input": "x", "reasoning": {"effort": "low"}, "text": {"verbosity": "low"},
                                       "store": False, "metadata": {"a": "b"}, "include": ["x.y"], "user": "u",
                                       "truncation": "disabled", "seed": 3, "stop": ["END"]})
    assert set(request.chat.noop) == {"verbosity", "reasoning"} and request.chat.unknown == ()
    assert request.store is False and request.chat.seed == 3 and request.chat.stop == ("END",)
    assert request.added == ({"role": "user", "content": "x"},) and request.instructions is None


async def test_reasoning_is_a_counted_noop_over_http(tiny_tokenizer):
    ep = Episode(tiny_tokenizer)
    async with ProxyServer() as server:
        server.register("tok", ep.handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            response = await client.responses.create(model="arl", input="hi", reasoning={"effort": "low"})
        assert response.output_text == SCRIPT[0]
        assert server.stats["noop_field:reasoning"] == 1 and server.stats["errors"] == 0
    assert ep.handler.stats["noop_fields"] == 1


async def test_pull_mode_answer_streams_responses_events(tiny_tokenizer):
    """`answer` (pull mode's pipes) speaks the Responses API too: ``event:``/``data:`` pairs, no [DONE]."""
    ep = Episode(tiny_tokenizer)
    body = json.dumps({"model": "arl", "input": "hi", "stream": True}).encode()
    status, raw = await answer(ep.handler, "e", "POST", "/v1/responses/", body)
    events = [e for e in raw.decode().split("\n\n") if e]
    assert status == 200 and events[0].startswith("event: response.created\ndata: {")
    assert events[-1].startswith("event: response.completed\n") and "[DONE]" not in raw.decode()
    final = json.loads(events[-1].split("data: ", 1)[1])["response"]
    assert final["output"][0]["content"][0]["text"] == SCRIPT[0] and final["status"] == "completed"
    ep.assert_token_exact()


def test_store_keeps_each_response_once_and_follows_the_links():
    from arl.intercept.responses import ResponseStore, StoredResponse

    store = ResponseStore(limit=3)
    user = {"role": "user", "content": "u"}
    for k in range(4):
        store.put(f"r{k}", StoredResponse(f"r{k - 1}" if k else None, (user,), {"role": "assistant", "content": str(k)}))
    assert len(store) == 3 and store.get("r0") is None
    assert store.conversation("r3") is None  # its chain reaches a forgotten response: refused, never guessed
    store.put("s", StoredResponse("r3", (), {"role": "assistant", "content": "s"}))
    store.put("t", StoredResponse(None, (user,), {"role": "assistant", "content": "t"}))
    assert store.conversation("t") == [user, {"role": "assistant", "content": "t"}]
