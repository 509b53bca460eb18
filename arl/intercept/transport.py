"""InProcessTransport: the proxy as an ``httpx`` transport, for any framework, with no socket.

    transport = InProcessTransport(server)                 # routes by bearer token, like the server
    client = openai.AsyncOpenAI(base_url=BASE_URL, api_key=token,
                                http_client=transport_client(transport))
    # or one episode's handler, no token needed:
    client = openai.AsyncOpenAI(base_url=BASE_URL, api_key="arl",
                                http_client=transport_client(InProcessTransport.for_handler(handler, episode_key)))

The stock ``openai`` client (and every framework that takes one, or an ``http_client``) then
plays the episode in process: each request its ``httpx`` client sends is answered by calling
the episode's handler directly, through the same `exchange` the HTTP proxy and pull mode use:
chat completions, the Responses API, the model list, streaming (the SSE stream arrives whole,
the reply is generated before the first event anyway), every error as the proxy answers it. So
an episode's samples are the ones the loopback proxy gives, without sockets, aiohttp or a
server task. The request still crosses the ``openai`` client's own JSON encoding (what any
``http_client`` gets); `InProcessClient` skips that too for agents that call
``client.chat.completions.create`` themselves.

Given a `ProxyServer` (it need not be started: nothing listens), the transport routes by the
``Authorization: Bearer <token>`` header exactly as the server does (401 / 404 / 410) and counts
in the server's ``stats``. Given one handler (`for_handler`), every request goes to it.

The transport subclasses the ``httpx`` the installed ``openai`` package uses (recent versions
use ``httpx2``, a fork); `transport_class` builds it for the other (the client and the
transport must come from the same module). `transport_client` builds the ``AsyncClient``.

Synchronous frameworks (smolagents' ``OpenAIModel`` builds an ``openai.OpenAI``) take
`SyncInProcessTransport` (`sync_transport_class` for the other ``httpx``), built on the event
loop's thread, the agent then run in a worker thread (``anyio.to_thread.run_sync``,
``asyncio.to_thread``): each request is answered on the loop, by the same code as the async
transport, the worker waiting for it (at most the request's read timeout), so the handler, the
tracker and the engine stay on their loop. Called on the loop's own thread it raises instead of
deadlocking. `sync_transport_client` builds the ``Client``::

    transport = SyncInProcessTransport.for_handler(handler, episode_key)  # on the loop
    http = sync_transport_client(transport)
    model = OpenAIModel("arl", api_base=BASE_URL, api_key="arl", client_kwargs={"http_client": http})
    await anyio.to_thread.run_sync(agent.run, task)                      # the sync agent, off the loop
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from arl.intercept.client import Handler, _httpx
from arl.intercept.exchange import MAX_BODY, Reply, exchange

BASE_URL = "http://arl.inprocess/v1"  # any host works: nothing is resolved or connected


class _Routing:
    """What both transports hold: a `ProxyServer` to route by token, or one episode's handler."""

    def __init__(self, server: Any = None, *, handler: Handler | None = None, episode_key: str = "arl",
                 model_name: str | None = None) -> None:
        if (server is None) == (handler is None):
            raise ValueError("give a ProxyServer or a handler (InProcessTransport.for_handler), not both")
        self.server, self.handler, self.episode_key = server, handler, episode_key
        self.model_name = model_name or getattr(server, "model_name", None) or "arl"

    @classmethod
    def for_handler(cls, handler: Handler, episode_key: str = "arl", *, model_name: str | None = None,
                    **kwargs: Any) -> Any:
        """Every request goes to ``handler(episode_key, request)`` (one episode; no token checked)."""
        return cls(handler=handler, episode_key=episode_key, model_name=model_name, **kwargs)

    async def _answer(self, request: Any, body: bytes) -> Any:
        """The ``httpx`` response to one request, as the loopback proxy answers it."""
        path = request.url.raw_path.decode("ascii", "replace")
        if self.server is not None:
            limit = getattr(self.server, "client_max_size", MAX_BODY)
            reply: Reply = await self.server.dispatch(
                request.method, path, request.headers.get("Authorization", ""), body if len(body) <= limit else None)
        else:
            reply = await exchange(self.handler, self.episode_key, request.method, path, body,
                                   model_name=self.model_name)
        kind = "text/event-stream" if reply.events is not None else "application/json"
        return self.httpx.Response(reply.status, headers={"content-type": kind}, content=reply.body,
                                   request=request)


@functools.cache
def transport_class(httpx: Any) -> type:
    """`InProcessTransport` for another ``httpx`` module (``httpx`` when openai uses ``httpx2``)."""

    class InProcessTransport(_Routing, httpx.AsyncBaseTransport):
        """An ``httpx`` transport answering requests with a `ProxyServer`'s handlers (routed by
        bearer token) or one handler (`for_handler`), in process (the module doc)."""

        def __init__(self, server: Any = None, *, handler: Handler | None = None, episode_key: str = "arl",
                     model_name: str | None = None) -> None:
            super().__init__(server, handler=handler, episode_key=episode_key, model_name=model_name)
            self.httpx = httpx

        async def handle_async_request(self, request: Any) -> Any:
            return await self._answer(request, await request.aread())

    return InProcessTransport


@functools.cache
def sync_transport_class(httpx: Any) -> type:
    """`SyncInProcessTransport` for another ``httpx`` module (the module doc)."""

    class SyncInProcessTransport(_Routing, httpx.BaseTransport):
        """A synchronous ``httpx`` transport for agents run in worker threads: each request is
        answered on the event loop it was built on (``loop``: default the running one), as
        `InProcessTransport` answers it."""

        def __init__(self, server: Any = None, *, handler: Handler | None = None, episode_key: str = "arl",
                     model_name: str | None = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
            super().__init__(server, handler=handler, episode_key=episode_key, model_name=model_name)
            self.httpx = httpx
            self.loop = loop or asyncio.get_running_loop()

        def handle_request(self, request: Any) -> Any:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self.loop:
                raise RuntimeError("SyncInProcessTransport was called on its event loop's thread, where the loop "
                                   "cannot answer it: run the synchronous agent in a worker thread "
                                   "(anyio.to_thread.run_sync / asyncio.to_thread)")
            timeout = (request.extensions.get("timeout") or {}).get("read")
            future = asyncio.run_coroutine_threadsafe(self._answer(request, request.read()), self.loop)
            try:
                return future.result(timeout)
            except TimeoutError:
                future.cancel()
                raise httpx.ReadTimeout(f"arl's handler did not answer within {timeout}s", request=request) from None

    return SyncInProcessTransport


InProcessTransport = transport_class(_httpx())
SyncInProcessTransport = sync_transport_class(_httpx())


def transport_client(transport: Any, **kwargs: Any) -> Any:
    """An ``AsyncClient`` of the transport's ``httpx`` module around it (for ``http_client=``)."""
    return transport.httpx.AsyncClient(transport=transport, **kwargs)


def sync_transport_client(transport: Any, **kwargs: Any) -> Any:
    """A ``Client`` of a `SyncInProcessTransport`'s ``httpx`` module around it (for ``http_client=``)."""
    return transport.httpx.Client(transport=transport, **kwargs)


__all__ = ["BASE_URL", "InProcessTransport", "SyncInProcessTransport", "sync_transport_class",
           "sync_transport_client", "transport_class", "transport_client"]
