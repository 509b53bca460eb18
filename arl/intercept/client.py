"""InProcessClient: ``client.chat.completions.create(...)`` (and ``client.responses.create``) as a plain function call.

It has the call signature and the return types of the `openai` package's async client, so agent
code written for `openai.AsyncOpenAI` runs unchanged; the request never touches a socket or JSON:
the keyword arguments become a body dict exactly as the stock client would send it (``None`` =
unset, ``extra_body`` merged at the top level), `parse_request` validates it (the same validator
the HTTP proxy uses), and the handler is awaited directly.

Errors: a handler's `InterceptError` (and a request that fails validation) is raised as the
`openai` exception the stock client raises for that HTTP response (`openai.BadRequestError` for
400, `openai.NotFoundError` for 404, `openai.APIStatusError` for 410, ...), built around a
synthetic `httpx` response whose body is the proxy's JSON error; any other handler exception is
raised as `openai.InternalServerError` chained to the original (``__cause__``). So agent code
sees the same exceptions in-process and over HTTP. ``timeout=`` raises `openai.APITimeoutError`.

``stream=True`` returns a `ChunkStream`: the reply's `openai.types.chat.ChatCompletionChunk`s
(`completion_chunks`, the ones the HTTP proxy sends as events; ``stream_options={"include_usage":
True}`` adds the usage chunk), iterated with ``async for`` and closed like the stock client's
``AsyncStream`` (``async with``, ``close()``). The reply is generated whole before the first chunk,
so errors are raised by ``create`` itself, as the stock client raises an error response.

``client.responses.create(...)`` is the Responses API the same way (`arl.intercept.responses`):
an `openai.types.responses.Response`, or with ``stream=True`` a `ChunkStream` of its
``ResponseStreamEvent``s; ``previous_response_id`` resolves in the handler's own store.
For frameworks that take an ``httpx`` client instead, see `arl.intercept.transport`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from arl.intercept.protocol import ChatRequest, InterceptError, completion_chunks, error_body, parse_request
from arl.intercept.responses import respond, response_events

Handler = Callable[[str, ChatRequest], Awaitable[Any]]  # (episode_key, request) -> openai ChatCompletion

URL = "http://arl.inprocess/v1/chat/completions"  # what the synthetic error responses point at


def _httpx() -> Any:
    try:  # the openai package has moved between httpx and its fork httpx2
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - depends on the installed openai
        import httpx
    return httpx


def openai_status_error(status: int, body: dict[str, Any]) -> Exception:
    """The `openai` exception the stock client raises for an error response (status, JSON body)."""
    import openai

    httpx = _httpx()
    response = httpx.Response(status, request=httpx.Request("POST", URL), json=body)
    error = body.get("error", body)
    message = f"Error code: {status}"
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        message += f" - {error['message']}"
    classes: dict[int, type[openai.APIStatusError]] = {
        400: openai.BadRequestError, 401: openai.AuthenticationError, 403: openai.PermissionDeniedError,
        404: openai.NotFoundError, 409: openai.ConflictError, 422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
    }
    cls = classes.get(status, openai.InternalServerError if status >= 500 else openai.APIStatusError)
    return cls(message, response=response, body=error)


_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})


def _plain(value: Any) -> Any:
    """Pydantic models (e.g. a ChatCompletionMessage appended to the history) -> plain data,
    as the stock client serializes them."""
    if type(value) in _SCALARS:  # most leaves: skip the attribute probe below
        return value
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(exclude_unset=True, mode="json"))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _plain_messages(messages: Any) -> Any:
    """`_plain` of the message list, leaving a message of plain strings (what agents usually
    append) as it is: `parse_request` copies what it keeps, so it needs no copy, and each
    request re-sends the whole history."""
    if not isinstance(messages, (list, tuple)):
        return _plain(messages)
    return [m if type(m) is dict and _STR.issuperset(map(type, m.values())) else _plain(m) for m in messages]


class ChunkStream:
    """What ``create(stream=True)`` returns in process: the reply's ``ChatCompletionChunk``s as
    an async iterator that, like the stock ``openai.AsyncStream``, is also an async context
    manager and has ``close()`` (later iterations then end)."""

    def __init__(self, chunks: list[Any]) -> None:
        self._chunks = iter(chunks)

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        self._chunks = iter(())

    async def __aenter__(self) -> ChunkStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class InProcessClient:
    """`openai.AsyncOpenAI` look-alike whose ``chat.completions.create`` awaits
    ``handler(episode_key, request)``. ``api_key`` is the episode key, as it is for the HTTP proxy."""

    def __init__(self, handler: Handler, episode_key: str, *, model: str = "arl") -> None:
        self.handler = handler
        self.episode_key = episode_key
        self.api_key = episode_key
        self.model = model
        self.base_url = URL.rsplit("/chat/completions", 1)[0] + "/"

    @property
    def chat(self) -> _Chat:
        """``client.chat.completions.create``. Built on each access, not stored: a stored one
        would point back at the client, and that reference cycle would keep the handler and
        everything it holds (a proxy episode's tracker: nodes, prompts, token lists) alive until
        a full garbage collection instead of freeing it when the agent drops the client."""
        return _Chat(self)

    @property
    def responses(self) -> _Responses:
        """``client.responses.create``: the Responses API (`arl.intercept.responses`), built on
        each access like `chat`."""
        return _Responses(self)

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> InProcessClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Chat:
    def __init__(self, client: InProcessClient) -> None:
        self.completions = _Completions(client)


class _Completions:
    def __init__(self, client: InProcessClient) -> None:
        self._client = client

    async def create(
        self,
        *,
        messages: Any,
        model: str | None = None,
        tools: Any = None,
        tool_choice: Any = None,
        max_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        n: int | None = None,
        stop: str | list[str] | None = None,
        logprobs: bool | None = None,
        stream: bool | None = None,
        extra_headers: Any = None,
        extra_query: Any = None,
        extra_body: dict[str, Any] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Same keywords as `openai.AsyncOpenAI().chat.completions.create`; returns a
        `openai.types.chat.ChatCompletion` (a `ChunkStream` with ``stream=True``). Other OpenAI
        fields (``user``, ``reasoning_effort``, ...) go through `parse_request` like any other:
        refused with a 400 or passed to the handler in ``request.extra`` (see `protocol`)."""
        fields = {
            "messages": messages, "model": model or self._client.model, "tools": tools,
            "tool_choice": tool_choice, "max_tokens": max_tokens,
            "max_completion_tokens": max_completion_tokens, "temperature": temperature, "top_p": top_p,
            "seed": seed, "n": n, "stop": stop, "logprobs": logprobs, "stream": stream, **kwargs,
        }
        body = {k: _plain_messages(v) if k == "messages" else _plain(v) for k, v in fields.items() if v is not None}
        body.update(_plain(extra_body or {}))

        async def call() -> Any:
            request = parse_request(body)
            completion = await self._client.handler(self._client.episode_key, request)
            if request.stream:
                return ChunkStream(completion_chunks(completion, include_usage=request.include_usage))
            return completion

        return await _call(call, timeout)


async def _call(call: Callable[[], Awaitable[Any]], timeout: Any) -> Any:
    """``await call()`` with the stock client's timeout and errors (the module doc)."""
    try:
        if timeout is not None and not (isinstance(timeout, (int, float)) and math.isinf(timeout)):
            with anyio.fail_after(float(timeout)):
                return await call()
        return await call()
    except InterceptError as exc:
        raise openai_status_error(exc.status, exc.to_json()) from exc
    except TimeoutError as exc:
        import openai

        raise openai.APITimeoutError(_httpx().Request("POST", URL)) from exc
    except Exception as exc:  # a handler bug: what the proxy would answer with a 500
        body = error_body(f"handler failed: {type(exc).__name__}: {exc}", "server_error", "handler_error")
        raise openai_status_error(500, body) from exc


class _Responses:
    def __init__(self, client: InProcessClient) -> None:
        self._client = client

    async def create(
        self,
        *,
        input: Any = None,
        model: str | None = None,
        instructions: str | None = None,
        previous_response_id: str | None = None,
        tools: Any = None,
        tool_choice: Any = None,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        store: bool | None = None,
        stream: bool | None = None,
        extra_headers: Any = None,
        extra_query: Any = None,
        extra_body: dict[str, Any] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Same keywords as `openai.AsyncOpenAI().responses.create`; returns an
        `openai.types.responses.Response` (with ``stream=True`` a `ChunkStream` of its
        `ResponseStreamEvent`s, `response_events`). Conversion, honoured and refused fields:
        `arl.intercept.responses`."""
        fields = {
            "input": input, "model": model or self._client.model, "instructions": instructions,
            "previous_response_id": previous_response_id, "tools": tools, "tool_choice": tool_choice,
            "max_output_tokens": max_output_tokens, "temperature": temperature, "top_p": top_p, "store": store,
            "stream": stream, **kwargs,
        }
        body = {k: _plain(v) for k, v in fields.items() if v is not None}
        body.update(_plain(extra_body or {}))

        async def call() -> Any:
            request, response = await respond(self._client.handler, self._client.episode_key, body)
            return ChunkStream(response_events(response)) if request.stream else response

        return await _call(call, timeout)
