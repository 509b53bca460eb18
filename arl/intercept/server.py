"""ProxyServer: the interception layer over real HTTP, for agents in other processes.

An aiohttp app on loopback serving ``POST /v1/chat/completions`` (``stream: true`` too: the
reply as server-sent events, `completion_chunks`), ``POST /v1/responses`` (the Responses API,
`arl.intercept.responses`, streamed too), ``GET /v1/models`` and
``GET /v1/models/{model}``. The request's ``Authorization: Bearer <token>`` picks the episode's
handler (the same handler an `InProcessClient` calls), so a stock
``openai.AsyncOpenAI(base_url=server.base_url, api_key=token)`` plays an episode exactly as the
in-process client does.

The token is whatever key `register` was given. `ProxyEnvManager` registers an unguessable
per-episode secret (``secrets.token_urlsafe(32)``), never the episode id: ids follow a pattern,
and an agent (or any local process) that could guess a sibling's key could write into that
episode's trajectory. `close_episode` revokes a token (410 from then on).

The server does not trust what reaches its port (any local process can connect). The token is
checked before any body byte is read: a request without a known token gets its 401 / 404 / 410
(and one whose ``Content-Length`` is over ``client_max_size`` its 413) at once, and the connection
is closed after a short linger that discards what was sent (`LINGER_S`), so a client that sends
most of a big body and stalls holds no memory. Bodies are read under two bounds: at most
``max_pending_bodies`` at once (each up to ``client_max_size`` bytes, so at most their product is
held by bodies still arriving; a request past the bound gets 503 at once, which the ``openai``
client retries), and each within ``body_timeout`` seconds (408 after). A connection with no request
in progress, including one that has not finished sending its headers, is closed after
``idle_timeout`` seconds (aiohttp's ``keepalive_timeout``). The number of connections is not
bounded (see docs/threat_model.md).

Every failure is an OpenAI-shaped JSON error, never a crash, and the server keeps serving:

======  ==================================================================================
401     missing or malformed ``Authorization: Bearer <token>``
404     unknown token (never registered, unregistered, or guessed); unknown route (the
        message lists the supported endpoints, after what to use instead for the routes
        frameworks call that arl does not serve, `exchange.UNSERVED`; counted and logged once
        per route)
405     wrong method on a known route
400     body is not JSON, not UTF-8, holds a string that is not valid Unicode (a lone surrogate:
        the message and ``param`` name the field, `exchange.invalid_unicode`), or is not a valid
        chat-completions request (`parse_request`)
408     the body did not arrive within ``body_timeout`` seconds (the connection is closed)
413     body larger than ``client_max_size`` (by its ``Content-Length`` before it is read)
410     the token's episode has ended (`close_episode`)
503     ``max_pending_bodies`` bodies are already being read (the connection is closed)
500     the handler raised something other than an `InterceptError` (its own status otherwise)
======  ==================================================================================

``stats`` counts every request (``requests``), the failed ones (``errors``), requests to
unknown routes (``unknown_paths``), streamed replies (``streams``), bodies refused at the
``max_pending_bodies`` bound (``busy``) or timed out (``body_timeouts``), and requests that set a
field arl accepts without acting on it: ``noop_fields`` (reasoning-model settings, see
`protocol.NOOP_FIELDS`) and ``unknown_fields``, each also per field as ``"noop_field:<name>"`` /
``"unknown_field:<name>"`` (`ChatHandler` logs each such field name once). The first request to
each unknown route is logged as a warning (``logging.getLogger("arl.intercept.server")``; arl
configures no logging).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from typing import Any

from aiohttp import web

from arl.intercept.client import Handler
from arl.intercept.exchange import (
    CHAT_PATH,
    RESPONSES_PATH,
    Reply,
    exchange,
    route_reply,
)
from arl.intercept.protocol import (
    ChatRequest,
    EpisodeClosed,
    InterceptError,
    PayloadTooLarge,
    ServerBusy,
    SlowBody,
    Unauthorized,
    UnknownEpisode,
    error_body,
)

MAX_WARNED = 1024  # distinct unknown fields / routes counted by name and logged once
MAX_CLOSED = 1 << 16  # closed episode keys remembered for their 410 (oldest forgotten first: then 404)

LINGER_S = 1.0  # after answering without reading a body: seconds aiohttp reads and discards it before closing

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
    """OpenAI-compatible chat-completions endpoint on loopback, routed by bearer episode key.

    ``async with ProxyServer() as server: server.register(episode_key, handler); ...``. ``port=0``
    takes an ephemeral port; `base_url` is ``http://127.0.0.1:<port>/v1``.

    The limits on untrusted clients (the module doc): ``client_max_size`` bytes per body (413);
    ``max_pending_bodies`` bodies read at once (503 past it; at most ``max_pending_bodies *
    client_max_size`` bytes, 256 MiB by default, held by bodies still arriving); ``body_timeout``
    seconds for a body to arrive (408); ``idle_timeout`` seconds before a connection without a
    request in progress is closed. Requests without a known bearer token never reach a body read.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, client_max_size: int = 4 * 2**20,
        model_name: str = "arl", max_pending_bodies: int = 64, body_timeout: float = 30.0,
        idle_timeout: float = 75.0,
    ) -> None:
        if max_pending_bodies < 1 or not body_timeout > 0 or not idle_timeout > 0:
            raise ValueError(f"max_pending_bodies must be >= 1 and the timeouts > 0, got {max_pending_bodies}, "
                             f"{body_timeout}, {idle_timeout}")
        self.host = host
        self.port = port
        self.client_max_size = client_max_size
        self.model_name = model_name
        self.max_pending_bodies = max_pending_bodies
        self.body_timeout = body_timeout
        self.idle_timeout = idle_timeout
        self._reading = 0  # bodies being read now
        self._handlers: dict[str, Handler] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._runner: web.AppRunner | None = None
        self.stats: dict[str, int] = {
            "requests": 0, "errors": 0, "unknown_paths": 0, "streams": 0, "noop_fields": 0, "unknown_fields": 0,
            "busy": 0, "body_timeouts": 0,
        }
        self._warned: set[str] = set()  # field names counted by name, routes logged once

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> ProxyServer:
        if self._runner is not None:
            return self
        app = web.Application(client_max_size=self.client_max_size, middlewares=[_errors])
        app.router.add_post(CHAT_PATH, self._post)
        app.router.add_post(RESPONSES_PATH, self._post)
        app.router.add_route("*", "/{path:.*}", self._other)  # models, 404s and 405s: `route_reply`
        runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=self.idle_timeout,
                               lingering_time=LINGER_S)
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
    def register(self, episode_key: str, handler: Handler) -> None:
        """Route ``Bearer episode_key`` to ``handler(episode_key, request)``; re-registering replaces it."""
        if not episode_key or any(c.isspace() for c in episode_key):
            raise ValueError(f"episode key must be non-empty without whitespace, got {episode_key!r}")
        self._closed.pop(episode_key, None)
        self._handlers[episode_key] = handler

    def unregister(self, episode_key: str) -> None:
        """Forget the episode key entirely (its requests get 404)."""
        self._handlers.pop(episode_key, None)
        self._closed.pop(episode_key, None)

    def close_episode(self, episode_key: str) -> None:
        """The episode ended: later requests with this episode key get 410."""
        self._handlers.pop(episode_key, None)
        self._closed[episode_key] = None
        self._closed.move_to_end(episode_key)
        while len(self._closed) > MAX_CLOSED:
            self._closed.popitem(last=False)

    @property
    def episode_keys(self) -> list[str]:
        return list(self._handlers)

    def _route(self, auth: str) -> tuple[str, Handler]:
        scheme, _, token = auth.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
            raise Unauthorized("missing or malformed 'Authorization: Bearer <episode_key>' header")
        handler = self._handlers.get(token)
        if handler is None:
            if token in self._closed:
                raise EpisodeClosed(f"the episode of key {token!r} has ended")
            raise UnknownEpisode(f"unknown episode key {token[:64]!r}")
        return token, handler

    # -- endpoints -------------------------------------------------------------------------------
    async def dispatch(self, method: str, path: str, authorization: str, body: bytes | None) -> Reply:
        """The reply to one request, counted in `stats` as the HTTP server counts it: what the
        aiohttp routes answer, and what `arl.intercept.transport.InProcessTransport` answers
        without a socket. ``body`` None: a POST whose body was not read (413)."""
        self.stats["requests"] += 1
        reply = route_reply(method, path, model_name=self.model_name)
        if reply is not None:
            if reply.status != 200:
                self.stats["errors"] += 1
            if reply.unknown_path:
                self.stats["unknown_paths"] += 1
                if self._first(f"path:{method} {path[:200]}"):
                    _log.warning("arl proxy (404): %s", json.loads(reply.body)["error"]["message"])
            return reply
        try:
            episode_key, handler = self._route(authorization)
            if body is None:
                raise PayloadTooLarge(f"request body too large: over {self.client_max_size} bytes")
        except InterceptError as exc:
            self.stats["errors"] += 1
            return Reply(exc.status, json.dumps(exc.to_json()).encode())
        # parse, validate, handle, serialize: the one exchange every transport shares (pull mode too)
        reply = await exchange(handler, episode_key, method, path, body, model_name=self.model_name,
                               max_body=self.client_max_size)
        if reply.request is not None:
            self._count_fields(reply.request)
        if reply.status != 200:
            self.stats["errors"] += 1
        if reply.events is not None:
            self.stats["streams"] += 1
        return reply

    async def _read_body(self, request: web.Request, authorization: str) -> bytes | Reply | None:
        """The request's body (None: over ``client_max_size``), or the `Reply` that refuses it
        unread: no known token (the `dispatch` of an empty body answers what the token gets), a
        ``Content-Length`` over the limit, ``max_pending_bodies`` reached. 408 when it does not
        arrive within ``body_timeout``."""
        try:
            self._route(authorization)
        except InterceptError:
            return await self.dispatch(request.method, request.path, authorization, b"")
        if request.content_length is not None and request.content_length > self.client_max_size:
            return await self.dispatch(request.method, request.path, authorization, None)
        refused: InterceptError
        if self._reading >= self.max_pending_bodies:
            self.stats["busy"] += 1
            refused = ServerBusy(f"the proxy is reading {self._reading} request bodies (max_pending_bodies); "
                                 f"retry shortly")
        else:
            self._reading += 1
            try:
                async with asyncio.timeout(self.body_timeout):
                    return await request.read()
            except web.HTTPRequestEntityTooLarge:
                return None
            except TimeoutError:
                self.stats["body_timeouts"] += 1
                refused = SlowBody(f"the request body did not arrive within {self.body_timeout}s (body_timeout)")
            finally:
                self._reading -= 1
        self.stats["requests"] += 1
        self.stats["errors"] += 1
        return Reply(refused.status, json.dumps(refused.to_json()).encode())

    async def _post(self, request: web.Request) -> web.StreamResponse:
        authorization = request.headers.get("Authorization", "")
        raw = await self._read_body(request, authorization)
        if isinstance(raw, Reply):  # answered without (all of) its body: the connection is not reused
            response = web.Response(status=raw.status, body=raw.body, content_type="application/json")
            if raw.status == 503:
                response.headers["Retry-After"] = "1"
            response.force_close()
            return response
        reply = await self.dispatch(request.method, request.path, authorization, raw)
        if reply.events is None:
            return web.Response(status=reply.status, body=reply.body, content_type="application/json")
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                           "Cache-Control": "no-cache"})
        try:
            await response.prepare(request)
            for event in reply.events:
                await response.write(event)
            await response.write_eof()
        except ConnectionError:  # the agent hung up mid-stream: its call was already recorded
            pass
        return response

    def _count_fields(self, request: ChatRequest) -> None:
        for kind, names in (("noop", request.noop), ("unknown", request.unknown)):
            for name in names:
                self.stats[f"{kind}_fields"] += 1
                key = f"{kind}_field:{name[:100]}"
                if key in self.stats or self._first(key):  # per-name counters: bounded
                    self.stats[key] = self.stats.get(key, 0) + 1

    def _first(self, key: str) -> bool:
        """Is this the first time `key` is seen? At most MAX_WARNED keys are remembered (an agent
        sending ever new field names or paths must not grow the stats or the log without bound)."""
        if key in self._warned or len(self._warned) >= MAX_WARNED:
            return False
        self._warned.add(key)
        return True

    async def _other(self, request: web.Request) -> web.StreamResponse:
        if route_reply(request.method, request.path, model_name=self.model_name) is None:
            return await self._post(request)  # a POST route with a trailing slash
        reply = await self.dispatch(request.method, request.path, request.headers.get("Authorization", ""), b"")
        return web.Response(status=reply.status, body=reply.body, content_type="application/json")
