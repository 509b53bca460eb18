"""ProxyServer: the interception layer over real HTTP, for agents in other processes.

An aiohttp app on loopback serving ``POST /v1/chat/completions`` and ``GET /v1/models``. The
request's ``Authorization: Bearer <token>`` picks the episode's handler (the same handler an
`InProcessClient` calls), so a stock ``openai.AsyncOpenAI(base_url=server.base_url,
api_key=token)`` plays an episode exactly as the in-process client does.

The token is whatever key `register` was given. `ProxyEnvManager` registers an unguessable
per-episode secret (``secrets.token_urlsafe(32)``), never the episode id: ids follow a pattern,
and an agent (or any local process) that could guess a sibling's key could write into that
episode's trajectory. `close_episode` revokes a token (410 from then on).

Every failure is an OpenAI-shaped JSON error, never a crash, and the server keeps serving:

======  ==================================================================================
401     missing or malformed ``Authorization: Bearer <token>``
404     unknown token (never registered, unregistered, or guessed), unknown route
405     wrong method on a known route
400     body is not JSON, or not a valid chat-completions request (`parse_request`)
413     body larger than ``client_max_size``
410     the token's episode has ended (`close_episode`)
500     the handler raised something other than an `InterceptError` (its own status otherwise)
======  ==================================================================================
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from aiohttp import web

from arl.intercept.client import Handler
from arl.intercept.exchange import CHAT_PATH, answer
from arl.intercept.protocol import (
    EpisodeClosed,
    InterceptError,
    PayloadTooLarge,
    Unauthorized,
    UnknownEpisode,
    error_body,
)

MAX_CLOSED = 1 << 16  # closed env ids remembered for their 410 (oldest forgotten first: then 404)

_log = logging.getLogger(__name__)


def _json_error(status: int, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own HTTP errors (404 route, 405, 413) in OpenAI's error shape."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        return _json_error(413, PayloadTooLarge(f"request body too large: {exc.text}").to_json())
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _json_error(exc.status, error_body(exc.reason, "invalid_request_error", f"http_{exc.status}"))


class ProxyServer:
    """OpenAI-compatible chat-completions endpoint on loopback, routed by bearer env id.

    ``async with ProxyServer() as server: server.register(env_id, handler); ...``. ``port=0``
    takes an ephemeral port; `base_url` is ``http://127.0.0.1:<port>/v1``.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, client_max_size: int = 4 * 2**20,
        model_name: str = "arl",
    ) -> None:
        self.host = host
        self.port = port
        self.client_max_size = client_max_size
        self.model_name = model_name
        self._handlers: dict[str, Handler] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._runner: web.AppRunner | None = None
        self.stats: dict[str, int] = {"requests": 0, "errors": 0}

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> ProxyServer:
        if self._runner is not None:
            return self
        app = web.Application(client_max_size=self.client_max_size, middlewares=[_errors])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> ProxyServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def base_url(self) -> str:
        if self._runner is None:
            raise RuntimeError("ProxyServer is not started (await server.start())")
        return f"http://{self.host}:{self.port}/v1"

    # -- routing ---------------------------------------------------------------------------------
    def register(self, env_id: str, handler: Handler) -> None:
        """Route ``Bearer env_id`` to ``handler(env_id, request)``; re-registering replaces it."""
        if not env_id or any(c.isspace() for c in env_id):
            raise ValueError(f"env id must be non-empty without whitespace, got {env_id!r}")
        self._closed.pop(env_id, None)
        self._handlers[env_id] = handler

    def unregister(self, env_id: str) -> None:
        """Forget the env id entirely (its requests get 404)."""
        self._handlers.pop(env_id, None)
        self._closed.pop(env_id, None)

    def close_episode(self, env_id: str) -> None:
        """The episode ended: later requests with this env id get 410."""
        self._handlers.pop(env_id, None)
        self._closed[env_id] = None
        self._closed.move_to_end(env_id)
        while len(self._closed) > MAX_CLOSED:
            self._closed.popitem(last=False)

    @property
    def env_ids(self) -> list[str]:
        return list(self._handlers)

    def _route(self, request: web.Request) -> tuple[str, Handler]:
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
            raise Unauthorized("missing or malformed 'Authorization: Bearer <env_id>' header")
        handler = self._handlers.get(token)
        if handler is None:
            if token in self._closed:
                raise EpisodeClosed(f"the episode of env id {token!r} has ended")
            raise UnknownEpisode(f"unknown env id {token[:64]!r}")
        return token, handler

    # -- endpoints -------------------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.Response:
        self.stats["requests"] += 1
        try:
            env_id, handler = self._route(request)
            raw = await request.read()
        except InterceptError as exc:
            self.stats["errors"] += 1
            return _json_error(exc.status, exc.to_json())
        except web.HTTPException:
            self.stats["errors"] += 1
            raise  # 413 and friends: the middleware shapes them
        # parse, validate, handle, serialize: the one exchange every transport shares (pull mode too)
        status, payload = await answer(handler, env_id, "POST", CHAT_PATH, raw, max_body=len(raw))
        if status != 200:
            self.stats["errors"] += 1
        return web.Response(status=status, body=payload, content_type="application/json")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({
            "object": "list",
            "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "arl"}],
        })
