"""Model servers on 127.0.0.1 for the `arl eval --base-url` tests (tests/test_eval_remote.py).

`FakeChatServer` answers ``POST /v1/chat/completions`` without a model, in a thread of its own
(so the CLI's ``asyncio.run`` can call it): ``"ok"`` a FrozenLake answer chosen by a hash of the
messages (the same messages, the same answer), ``"hang"`` never within the client's timeout,
``"garbage"`` a 200 whose body is not JSON, ``"empty"`` a JSON object with no choices, ``"shape"``
one whose content is a number and usage strings, ``"html"`` a 200 HTML page, ``"drop"`` half a body
and a closed connection, ``"error"`` a 500, ``"flaky"`` every third request garbage and the others ok. `ModelServer` serves an engine
through arl's own `ProxyServer`, each request a fresh conversation. `closed_port` is a port that
refuses connections.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
from typing import Any

from aiohttp import web

ACTIONS = ("Left", "Down", "Right", "Up")
HANG_S = 30.0  # a hanging reply's delay: past any test's --request-timeout, within its own bound


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answer(messages: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).digest()
    return f"<answer>{ACTIONS[digest[0] % 4]}</answer>"


def completion(model: str, text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}}


class _Threaded:
    """An event loop in a daemon thread: ``start()`` runs ``self._serve()`` there, ``stop()`` ends it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.base_url = ""

    def start(self) -> _Threaded:
        self.thread.start()
        self.base_url = asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(timeout=600)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self) -> str:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError


class FakeChatServer(_Threaded):
    def __init__(self, mode: str = "ok", delay_s: float = 0.0) -> None:
        super().__init__()
        self.mode, self.delay_s = mode, delay_s
        self.requests = 0
        self.models: set[str] = set()  # the model names asked for
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        body = await request.json()
        self.models.add(str(body.get("model")))
        await asyncio.sleep(self.delay_s)
        mode = self.mode
        if mode == "flaky":
            mode = "garbage" if self.requests % 3 == 0 else "ok"
        if mode == "hang":
            await asyncio.sleep(HANG_S)
        if mode == "garbage":
            return web.Response(text="{not json at all", content_type="application/json")
        if mode == "empty":
            return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                      "choices": []})
        if mode == "shape":  # JSON of the wrong shape: the content a number, the usage strings
            body = completion("m", "x")
            body["choices"][0]["message"]["content"] = 5
            body["usage"] = {"prompt_tokens": "many", "completion_tokens": None}
            return web.json_response(body)
        if mode == "html":
            return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="text/html")
        if mode == "drop":  # half a body, then the connection closed
            response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "400"})
            await response.prepare(request)
            await response.write(b'{"id": "chatcmpl-x", "choices": [')
            assert request.transport is not None
            request.transport.close()
            return response
        if mode == "error":
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
        return web.json_response(completion(body.get("model", "fake"), answer(body["messages"])))

    async def _serve(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)  # a hanging reply is not waited for
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}/v1"

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class ModelServer(_Threaded):
    """``model`` on ``backend`` served by a `ProxyServer` under the key ``api_key``: each request
    gets a fresh `ChatHandler` and `MessageTracker`, so requests are independent conversations, as
    on any model server."""

    def __init__(self, model: str = "tiny", backend: str = "hf", api_key: str = "arl-test-key") -> None:
        super().__init__()
        self.model, self.backend, self.api_key = model, backend, api_key
        self._engine: Any = None
        self._server: Any = None

    async def _serve(self) -> str:
        from arl.engine import make_engine
        from arl.intercept.handler import ChatHandler
        from arl.intercept.server import ProxyServer
        from arl.intercept.tracker import MessageTracker

        self._engine = make_engine(backend=self.backend, model=self.model)
        await self._engine.__aenter__()
        engine = self._engine

        async def serve(key: str, request: Any) -> Any:
            return await ChatHandler(engine, MessageTracker(engine.tokenizer))(key, request)

        self._server = ProxyServer(model_name=self.model)
        await self._server.start()
        self._server.register(self.api_key, serve)
        return str(self._server.base_url)

    async def _close(self) -> None:
        if self._server is not None:
            await self._server.stop()
        if self._engine is not None:
            await self._engine.__aexit__(None, None, None)
