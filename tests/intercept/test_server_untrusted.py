"""ProxyServer against clients it must not trust (issue 47 C): the token is checked before any body
byte is read, unread bodies are bounded in number and time, idle connections are closed, and text
that is valid JSON but not valid Unicode is a 400 naming the field, never a 500.

Every client here is a raw socket to the server the test started on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from arl.intercept import ChatRequest, ProxyServer, make_completion
from arl.intercept.exchange import exchange, invalid_unicode

pytestmark = pytest.mark.anyio

BIG = 10 * 2**20  # a Content-Length the test never sends
WAIT = 5.0  # seconds any answer may take here (the server's own timeouts are well under it)


async def echo_handler(episode_key: str, request: ChatRequest):
    """Echoes the request's model and last message: text the reply's serializer must encode."""
    return make_completion(completion_id="c", model=request.model, content=str(request.messages[-1].get("content")),
                           finish_reason="stop", prompt_tokens=1, completion_tokens=1)


def head(auth: str | None, length: int | None, path: str = "/v1/chat/completions") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if auth is not None:
        lines.append(f"Authorization: {auth}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


_OPEN: list[asyncio.StreamWriter] = []  # every client socket, closed before its server stops


@contextlib.asynccontextmanager
async def serving(**kwargs):
    """A started server with episode "good" registered; on exit every client socket is closed first
    (a failing test would otherwise leave a stalled body that aiohttp's shutdown waits 60 s for)."""
    async with ProxyServer(**kwargs) as server:
        server.register("good", echo_handler)
        try:
            yield server
        finally:
            while _OPEN:
                _OPEN.pop().close()


async def send(server: ProxyServer, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    _OPEN.append(writer)
    writer.write(data)
    await writer.drain()
    return reader, writer


async def answer(reader: asyncio.StreamReader, timeout: float = WAIT) -> tuple[int, dict, bytes]:
    """The status, headers and body of one response (failing the test past ``timeout``)."""
    async with asyncio.timeout(timeout):
        status_line = await reader.readline()
        assert status_line.startswith(b"HTTP/1.1 "), status_line
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader, timeout: float = WAIT) -> bool:
    """Does the server close the connection within ``timeout`` (whatever it sends first)?"""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


async def stalled(server: ProxyServer, auth: str | None, length: int = BIG):
    """A client that sends the headers and a few bytes of a ``length``-byte body, then nothing."""
    return await send(server, head(auth, length) + b'{"model": "m", "messages": [')


async def test_no_token_is_refused_before_the_body():
    async with serving() as server:
        server.register("gone", echo_handler)
        server.close_episode("gone")
        cases = ((None, 401), ("Basic abc", 401), ("Bearer nobody", 404), ("Bearer gone", 410))
        clients = [await stalled(server, auth) for auth, _ in cases]
        for (auth, status), (reader, _) in zip(cases, clients, strict=True):
            got, headers, body = await answer(reader)  # today's server waited for the 10 MB that never came
            assert got == status and "error" in json.loads(body), (auth, got, body)
            assert headers.get("connection") == "close"
        for reader, _ in clients:
            assert await closed(reader)  # not kept open for the rest of the body
        assert server.stats["requests"] == 4 and server.stats["errors"] == 4


async def test_a_declared_oversize_body_is_refused_before_it_is_read():
    async with serving(client_max_size=4096) as server:
        reader, writer = await stalled(server, "Bearer good")
        got, _, body = await answer(reader)
        assert got == 413 and json.loads(body)["error"]["code"] == "payload_too_large"
        writer.close()


async def test_stalled_bodies_are_bounded_then_time_out():
    async with serving(max_pending_bodies=2, body_timeout=1.0) as server:
        held = [await stalled(server, "Bearer good", 4096) for _ in range(2)]
        async with asyncio.timeout(WAIT):
            while server._reading < 2:  # both reads under way
                await asyncio.sleep(0.01)
        reader, writer = await stalled(server, "Bearer good", 4096)
        got, headers, body = await answer(reader)
        assert got == 503 and json.loads(body)["error"]["code"] == "server_busy" and headers["retry-after"] == "1"
        assert await closed(reader)
        writer.close()
        for reader, writer in held:  # the stalled ones: 408 after body_timeout, then closed
            got, _, body = await answer(reader)
            assert got == 408 and json.loads(body)["error"]["code"] == "request_timeout"
            assert await closed(reader)
            writer.close()
        assert server.stats["busy"] == 1 and server.stats["body_timeouts"] == 2 and server._reading == 0
        good = json.dumps({"model": "m", "messages": [{"role": "user", "content": "u"}]}).encode()
        reader, writer = await send(server, head("Bearer good", len(good)) + good)  # the slots are free again
        got, _, body = await answer(reader)
        assert got == 200 and json.loads(body)["choices"][0]["message"]["content"] == "u"
        writer.close()


async def test_idle_and_half_sent_connections_are_closed():
    async with serving(idle_timeout=0.3) as server:
        silent = await send(server, b"")
        half_head = await send(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for reader, writer in (silent, half_head):
            assert await closed(reader)  # aiohttp's own default kept them an hour
            writer.close()


BAD_TEXT = [
    # (body, the field the 400 names)
    (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    (b'{"model": "\\udfff", "messages": [{"role": "user", "content": "u"}]}', "model"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "a\\udc00"}]}',
     "messages[1].content"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "u"}], "metadata": {"\\ud800k": 1}}',
     "metadata.\\ud800k (a key)"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',  # a surrogate's UTF-8 bytes
     "messages[0].content"),
]


@pytest.mark.parametrize(("body", "field"), BAD_TEXT)
async def test_invalid_unicode_is_a_400_naming_the_field(body, field):
    async with serving() as server:
        reader, writer = await send(server, head("Bearer good", len(body)) + body)
        got, _, raw = await answer(reader)
        error = json.loads(raw)["error"]
        assert got == 400 and error["param"] == field and field in error["message"], (got, raw)  # today: 500
        writer.close()


async def test_invalid_utf8_is_a_400_and_valid_text_passes():
    async with serving() as server:
        bad = b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}'
        reader, writer = await send(server, head("Bearer good", len(bad)) + bad)
        got, _, raw = await answer(reader)
        assert got == 400 and "UTF-8" in json.loads(raw)["error"]["message"]
        pair = '{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude00 h\u00e9"}]}'.encode()
        writer.write(head("Bearer good", len(pair)) + pair)  # same connection: kept alive after a 400
        got, _, raw = await answer(reader)
        assert got == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "\U0001f600 h\u00e9"
        writer.close()


async def test_invalid_unicode_is_refused_by_every_transport():
    """The check is in `exchange`: pull mode, the in-process transport and the Responses API get it too."""
    chat = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
    status, body = (r := await exchange(echo_handler, "k", "POST", "/v1/chat/completions", chat)).status, r.body
    assert status == 400 and json.loads(body)["error"]["param"] == "messages[0].content"
    responses = b'{"model": "m", "input": [{"role": "user", "content": "\\ud800"}]}'
    reply = await exchange(echo_handler, "k", "POST", "/v1/responses", responses)
    assert reply.status == 400 and json.loads(reply.body)["error"]["param"] == "input[0].content"
    assert invalid_unicode({"a": ["x", {"b": "\ud800"}]}) == "a[1].b"
    assert invalid_unicode(["\udc00"]) == "[0]" and invalid_unicode("\ud800") == "(the body)"
    assert invalid_unicode({"a": ["x", "\u00e9", "\U0001f600"], "\u00e9": 1}) is None
    long = {"k" * 100: [[[["\ud800"]]]]}
    assert len(invalid_unicode(long)) <= 203
