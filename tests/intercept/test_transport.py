"""InProcessTransport: the stock `openai.AsyncOpenAI` over an httpx transport that calls the
episode's handler in process (no socket): chat completions, the Responses API, the model list,
streaming and errors answer as the loopback proxy answers them, with the same samples."""

from __future__ import annotations

import json

import anyio
import httpx
import openai
import pytest

from arl.engine.scripted import ScriptedEngine
from arl.intercept import ChatHandler, MessageTracker, ProxyServer
from arl.intercept.transport import BASE_URL, InProcessTransport, transport_class, transport_client

pytestmark = pytest.mark.anyio

CALL = '<tool_call>{"name": "move", "arguments": {"d": "Up"}}</tool_call>'
SCRIPT = ["Hello.", "Moving. " + CALL, "done"]
TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {}}}}]
RESPONSE_TOOLS = [{"type": "function", "name": "move", "parameters": {"type": "object", "properties": {}}}]


class Episode:
    def __init__(self, tokenizer):
        self.engine = ScriptedEngine(tokenizer, responses=SCRIPT)
        self.tracker = MessageTracker(tokenizer)
        self.gens: list = []
        self.handler = ChatHandler(self.engine, self.tracker, generate=self._generate)

    async def _generate(self, prompt_ids, params):
        gen = await self.engine.generate(prompt_ids, params)
        self.gens.append(gen)
        return gen

    def samples(self):
        return [(s.input_ids, s.response_mask, s.logprobs) for s in self.tracker.step_samples()]

    def assert_token_exact(self):
        for sample, gen in zip(self.tracker.step_samples(), self.gens, strict=True):
            assert [t for t, m in zip(sample.input_ids, sample.response_mask, strict=True) if m] == list(gen.token_ids)


async def play(client) -> list:
    """Chat (plain, streamed), then the Responses API (plain, streamed, chained): what a framework does."""
    out = []
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    completion = await client.chat.completions.create(model="arl", messages=history, tools=TOOLS)
    out.append(completion.choices[0].message.content)
    history.append(completion.choices[0].message)
    history.append({"role": "user", "content": "again"})
    chunks = [c async for c in await client.chat.completions.create(model="arl", messages=history, tools=TOOLS,
                                                                     stream=True)]
    calls = [t.function.name for c in chunks for t in c.choices[0].delta.tool_calls or () if t.function.name]
    out.append(calls)
    events = [e async for e in await client.responses.create(model="arl", input="go", instructions="s",
                                                             tools=RESPONSE_TOOLS, stream=True)]
    response = events[-1].response
    out.append(response.output_text)
    follow = await client.responses.create(model="arl", input=[{"role": "user", "content": "more"}],
                                           previous_response_id=response.id, instructions="s", tools=RESPONSE_TOOLS)
    out.append([(o.type, o.name) if o.type == "function_call" else (o.type, o.content[0].text) for o in follow.output])
    out.append([m.id for m in (await client.models.list()).data])
    return out


async def test_server_routed_transport_answers_as_the_http_proxy(tiny_tokenizer):
    http, local = Episode(tiny_tokenizer), Episode(tiny_tokenizer)
    async with ProxyServer() as server:
        server.register("tok", http.handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            expected = await play(client)
        http_stats = dict(server.stats)
    unstarted = ProxyServer()  # nothing listens: the transport calls its request handling
    unstarted.register("tok", local.handler)
    async with (transport_client(InProcessTransport(unstarted)) as http_client,
                openai.AsyncOpenAI(base_url=BASE_URL, api_key="tok", max_retries=0, http_client=http_client) as client):
        got = await play(client)
    assert got == expected
    assert expected[0] == "Hello." and expected[1] == ["move"] and expected[4] == ["arl"]
    assert unstarted.stats == http_stats and unstarted.stats["streams"] == 2 and unstarted.stats["requests"] == 5
    local.assert_token_exact()
    assert local.samples() == http.samples()


async def test_transport_errors_are_the_proxy_errors(tiny_tokenizer):
    ep = Episode(tiny_tokenizer)
    server = ProxyServer(client_max_size=4096)
    server.register("tok", ep.handler)
    async with transport_client(InProcessTransport(server)) as http_client:
        def client(key):
            return openai.AsyncOpenAI(base_url=BASE_URL, api_key=key, max_retries=0, http_client=http_client)

        with pytest.raises(openai.NotFoundError) as info:
            await client("guess").chat.completions.create(model="arl", messages=[{"role": "user", "content": "x"}])
        assert info.value.body["code"] == "unknown_episode_key"
        with pytest.raises(openai.NotFoundError) as info:
            await client("tok").embeddings.create(model="arl", input="x")
        assert "POST /v1/responses" in info.value.body["message"] and info.value.body["code"] == "unknown_endpoint"
        with pytest.raises(openai.BadRequestError) as info:
            await client("tok").responses.create(model="arl", input="x", tools=RESPONSE_TOOLS,
                                                 tool_choice={"type": "function", "name": "jump"})
        assert info.value.body["param"] == "tool_choice"
        with pytest.raises(openai.APIStatusError) as info:
            await client("tok").chat.completions.create(model="arl", messages=[{"role": "user", "content": "x" * 5000}])
        assert info.value.status_code == 413
        raw = await http_client.post(f"{BASE_URL}/chat/completions", content=b"{}")
        assert raw.status_code == 401 and raw.json()["error"]["type"] == "authentication_error"
        server.close_episode("tok")
        with pytest.raises(openai.APIStatusError) as info:
            await client("tok").responses.create(model="arl", input="x")
        assert info.value.status_code == 410
    assert server.stats["errors"] == server.stats["requests"] == 6 and server.stats["unknown_paths"] == 1
    assert ep.gens == []


async def test_handler_transport_and_plain_httpx(tiny_tokenizer):
    ep = Episode(tiny_tokenizer)
    transport = InProcessTransport.for_handler(ep.handler, "e", model_name="policy")
    async with (transport_client(transport) as http_client,
                openai.AsyncOpenAI(base_url=BASE_URL, api_key="anything", max_retries=0, http_client=http_client) as c):
        response = await c.responses.create(model="policy", input="hi")
        assert response.output_text == "Hello." and response.model == "policy"
        assert [m.id for m in (await c.models.list()).data] == ["policy"]
    # the same transport for the plain httpx package (the one frameworks may hold besides openai's)
    plain = transport_class(httpx).for_handler(ep.handler, "e")
    assert isinstance(plain, httpx.AsyncBaseTransport)
    async with httpx.AsyncClient(transport=plain) as client:
        reply = await client.post(f"{BASE_URL}/chat/completions",
                                  json={"messages": [{"role": "user", "content": "hi"}], "stream": True})
        assert reply.headers["content-type"] == "text/event-stream"
        events = [line for line in reply.text.split("\n\n") if line]
        assert events[-1] == "data: [DONE]" and json.loads(events[1][6:])["choices"][0]["delta"]["content"]
    with pytest.raises(ValueError, match="not both"):
        transport_class(httpx)()
    ep.assert_token_exact()


async def test_concurrent_episodes_share_one_client(tiny_tokenizer):
    server = ProxyServer()
    episodes = {f"t{k}": Episode(tiny_tokenizer) for k in range(8)}
    for token, ep in episodes.items():
        server.register(token, ep.handler)
    async with transport_client(InProcessTransport(server)) as http_client:
        async def one(token):  # no `async with`: closing a client closes its http_client, shared here
            await play(openai.AsyncOpenAI(base_url=BASE_URL, api_key=token, max_retries=0, http_client=http_client))

        async with anyio.create_task_group() as tg:
            for token in episodes:
                tg.start_soon(one, token)
    first = next(iter(episodes.values())).samples()
    for ep in episodes.values():
        ep.assert_token_exact()
        assert ep.samples() == first and len(ep.gens) == 4


def sync_play(client) -> list:
    """`play` with the synchronous ``openai.OpenAI`` (what smolagents' OpenAIModel builds)."""
    out = []
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    completion = client.chat.completions.create(model="arl", messages=history, tools=TOOLS)
    out.append(completion.choices[0].message.content)
    history.append(completion.choices[0].message)
    history.append({"role": "user", "content": "again"})
    chunks = list(client.chat.completions.create(model="arl", messages=history, tools=TOOLS, stream=True))
    out.append([t.function.name for c in chunks for t in c.choices[0].delta.tool_calls or () if t.function.name])
    events = list(client.responses.create(model="arl", input="go", instructions="s", tools=RESPONSE_TOOLS,
                                          stream=True))
    response = events[-1].response
    out.append(response.output_text)
    follow = client.responses.create(model="arl", input=[{"role": "user", "content": "more"}],
                                     previous_response_id=response.id, instructions="s", tools=RESPONSE_TOOLS)
    out.append([(o.type, o.name) if o.type == "function_call" else (o.type, o.content[0].text) for o in follow.output])
    out.append([m.id for m in client.models.list().data])
    return out


async def test_sync_transport_in_a_worker_thread_answers_as_the_async_one(tiny_tokenizer):
    """A synchronous agent run in a worker thread: each request is answered on the loop by the
    same code as the async transport, with the same replies and samples."""
    from arl.intercept.transport import SyncInProcessTransport, sync_transport_client

    ref, routed, direct = Episode(tiny_tokenizer), Episode(tiny_tokenizer), Episode(tiny_tokenizer)
    async with (transport_client(InProcessTransport.for_handler(ref.handler, "e")) as http_client,
                openai.AsyncOpenAI(base_url=BASE_URL, api_key="arl", max_retries=0, http_client=http_client) as c):
        expected = await play(c)
    server = ProxyServer()
    server.register("tok", routed.handler)
    for transport, key in ((SyncInProcessTransport(server), "tok"), (SyncInProcessTransport.for_handler(direct.handler),
                                                                     "any")):
        with (sync_transport_client(transport) as http,
              openai.OpenAI(base_url=BASE_URL, api_key=key, max_retries=0, http_client=http) as client):
            assert await anyio.to_thread.run_sync(sync_play, client) == expected
    assert server.stats["requests"] == 5 and server.stats["streams"] == 2
    for ep in (routed, direct):
        ep.assert_token_exact()
        assert ep.samples() == ref.samples()


async def test_sync_transport_refuses_the_loop_thread_and_times_out(tiny_tokenizer):
    from arl.intercept.transport import SyncInProcessTransport, sync_transport_client

    ep = Episode(tiny_tokenizer)
    with sync_transport_client(SyncInProcessTransport.for_handler(ep.handler)) as http:
        with pytest.raises(RuntimeError, match="worker thread"):  # the loop would wait for itself
            http.get(f"{BASE_URL}/models")
    started = anyio.Event()

    async def slow(episode_key, request):
        started.set()
        await anyio.sleep(60)

    with (sync_transport_client(SyncInProcessTransport.for_handler(slow)) as http,
          openai.OpenAI(base_url=BASE_URL, api_key="k", max_retries=0, http_client=http, timeout=0.3) as client):
        with anyio.fail_after(20), pytest.raises(openai.APITimeoutError):
            await anyio.to_thread.run_sync(
                lambda: client.chat.completions.create(model="arl", messages=[{"role": "user", "content": "x"}]))
    assert started.is_set()
