"""ProxyServer: bearer routing, OpenAI-shaped errors for every bad input, and it keeps serving."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading

import aiohttp
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arl.intercept import ChatRequest, InterceptError, ProxyServer, make_completion
from arl.intercept.protocol import EpisodeClosed

MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
GOOD = json.dumps({"model": "m", "messages": MESSAGES}).encode()


async def ok_handler(episode_key: str, request: ChatRequest):
    return make_completion(completion_id=f"c-{episode_key}", model=request.model, content=f"hi {episode_key}",
                           finish_reason="stop", prompt_tokens=2, completion_tokens=1)


async def broken_handler(episode_key: str, request: ChatRequest):
    raise RuntimeError("handler bug")


async def post(session, server, body=GOOD, auth="Bearer good", **kw):
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    async with session.post(f"{server.base_url}/chat/completions", data=body, headers=headers, **kw) as r:
        return r.status, await r.json(content_type=None)


def assert_error(status_body, status):
    got, body = status_body
    assert got == status, body
    assert set(body["error"]) >= {"message", "type", "code"} and isinstance(body["error"]["message"], str)


@pytest.mark.anyio
async def test_status_codes_and_keeps_serving():
    async with ProxyServer(client_max_size=4096) as server, aiohttp.ClientSession() as s:
        assert server.base_url.startswith("http://127.0.0.1:") and server.port > 0
        server.register("good", ok_handler)
        server.register("broken", broken_handler)
        status, body = await post(s, server)
        assert status == 200 and body["choices"][0]["message"]["content"] == "hi good"
        assert_error(await post(s, server, auth=None), 401)
        assert_error(await post(s, server, auth="Basic abc"), 401)
        assert_error(await post(s, server, auth="Bearer "), 401)
        assert_error(await post(s, server, auth="Bearer nobody"), 404)
        assert_error(await post(s, server, body=b"{not json"), 400)
        assert_error(await post(s, server, body=b"\xff\xfe"), 400)
        assert_error(await post(s, server, body=b"[1, 2]"), 400)
        assert_error(await post(s, server, body=json.dumps({"messages": [{"role": "bot", "content": "x"}]})), 400)
        assert_error(await post(s, server, body=json.dumps({"messages": MESSAGES, "pad": "x" * 8000})), 413)
        assert_error(await post(s, server, auth="Bearer broken"), 500)
        server.close_episode("good")
        assert_error(await post(s, server), 410)
        server.unregister("good")
        assert_error(await post(s, server), 404)
        async with s.get(f"{server.base_url}/chat/completions") as r:
            assert r.status == 405 and "error" in await r.json()
        async with s.get(f"{server.base_url}/models") as r:
            assert r.status == 200 and (await r.json())["data"][0]["id"] == "arl"
        server.register("good", ok_handler)  # re-registering revives it
        assert (await post(s, server))[0] == 200


@pytest.mark.anyio
async def test_handler_intercept_errors_keep_their_status():
    async def closed(episode_key, request):
        raise EpisodeClosed("done")

    async with ProxyServer() as server, aiohttp.ClientSession() as s:
        server.register("e", closed)
        assert_error(await post(s, server, auth="Bearer e"), 410)


@pytest.mark.anyio
async def test_handler_500s_are_logged_with_their_traceback(caplog):
    async def closed(episode_key, request):
        raise EpisodeClosed("done")

    caplog.set_level(logging.ERROR, logger="arl.intercept")  # the shared exchange logs it
    async with ProxyServer() as server, aiohttp.ClientSession() as s:
        server.register("broken", broken_handler)
        server.register("closed", closed)
        assert_error(await post(s, server, auth="Bearer closed"), 410)
        assert not caplog.records  # an InterceptError is the client's answer, not a server fault
        assert_error(await post(s, server, auth="Bearer broken"), 500)
    [record] = [r for r in caplog.records if r.name.startswith("arl.intercept")]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert record.exc_info[0] is RuntimeError and "handler bug" in str(record.exc_info[1])
    assert "broken_handler" in caplog.text  # the traceback names the raising function


@pytest.mark.anyio
async def test_stock_openai_client_round_trip():
    async with ProxyServer() as server:
        server.register("episode/0", ok_handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="episode/0", max_retries=0) as client:
            out = await client.chat.completions.create(model="m", messages=MESSAGES)
            assert out.choices[0].message.content == "hi episode/0" and out.usage.total_tokens == 3
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model="m", messages=[])
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="other", max_retries=0) as client:
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model="m", messages=MESSAGES)


# -- fuzzing: a server on a background loop, raw HTTP from hypothesis examples --------------------


class ThreadedServer:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.server = ProxyServer(client_max_size=8192)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        self.server.register("good", ok_handler)
        self.server.register("broken", broken_handler)
        self.server.close_episode("gone")
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def request(self, body: bytes, headers: dict[str, str], path="/v1/chat/completions"):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def fuzz_server():
    with ThreadedServer() as srv:
        yield srv


def check_response(status: int, raw: bytes, allowed: set[int]):
    assert status in allowed, (status, raw[:200])
    if status == 200 and raw.startswith(b"data: "):  # a streamed reply: server-sent events
        events = raw.split(b"\n\n")
        assert events[-2:] == [b"data: [DONE]", b""], raw[-200:]
        for event in events[:-2]:
            assert json.loads(event.removeprefix(b"data: "))["object"] == "chat.completion.chunk"
        return
    body = json.loads(raw)
    if status != 200:
        assert isinstance(body["error"]["message"], str) and "type" in body["error"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "bot", ""]) | json_values,
        "content": st.text(max_size=30) | json_values,
        "tool_calls": json_values,
        "tool_call_id": st.text(max_size=5) | json_values,
        "name": json_values,
    },
)
request_body = st.fixed_dictionaries(
    {"messages": st.lists(message, max_size=4) | json_values},
    optional={
        "model": json_values, "tools": json_values, "max_tokens": json_values, "temperature": json_values,
        "top_p": json_values, "n": json_values, "stop": json_values, "seed": json_values, "stream": json_values,
        "stream_options": json_values, "tool_choice": json_values, "response_format": json_values,
        "parallel_tool_calls": json_values, "reasoning_effort": json_values, "logit_bias": json_values,
    },
)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(body=request_body)
def test_fuzz_json_bodies(fuzz_server, body):
    status, raw = fuzz_server.request(json.dumps(body).encode(), {"Authorization": "Bearer good"})
    check_response(status, raw, {200, 400, 413})


@FUZZ
@given(body=st.binary(max_size=300))
def test_fuzz_raw_bytes(fuzz_server, body):
    status, raw = fuzz_server.request(body, {"Authorization": "Bearer good"})
    check_response(status, raw, {200, 400})


@FUZZ
@given(
    auth=st.one_of(
        st.none(),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
        st.sampled_from(["good", "broken", "gone", "nobody", ""]).map(lambda t: f"Bearer {t}"),
    ),
    extra=st.dictionaries(st.sampled_from(["X-Foo", "Content-Type", "Accept"]),
                          st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20), max_size=2),
    big=st.booleans(),
)
def test_fuzz_headers(fuzz_server, auth, extra, big):
    headers = dict(extra)
    if auth is not None:
        headers["Authorization"] = auth
    body = json.dumps({"messages": MESSAGES, "pad": "x" * 9000}).encode() if big else GOOD
    status, raw = fuzz_server.request(body, headers)
    check_response(status, raw, {200, 401, 404, 410, 413, 500})
    token = (auth or "").strip()
    if not token.lower().startswith("bearer ") or not token[7:].strip():
        assert status == 401
    elif token[7:].strip() == "nobody":
        assert status == 404
    elif token[7:].strip() == "gone":
        assert status == 410


def test_fuzzed_server_still_serves(fuzz_server):
    status, raw = fuzz_server.request(GOOD, {"Authorization": "Bearer good"})
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "hi good"


def test_intercept_errors_have_the_openai_shape():
    err = InterceptError("boom")
    assert err.to_json() == {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}
