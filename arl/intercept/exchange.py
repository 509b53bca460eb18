"""One chat-completions exchange without a web server: raw request in, status and body out.

Transports that are not HTTP (pull mode's pipes, `arl/agents/pull.py`) carry an agent's raw
HTTP request to the trainer; `answer` answers it exactly as `ProxyServer` does: the body is
parsed as JSON, validated by `parse_request` (the validator every transport uses) and handed to
the episode's handler, and the completion is serialized as the server serializes it
(``model_dump_json(exclude_unset=True)``; with ``stream: true`` the server-sent events of
`completion_chunks`, ending in ``data: [DONE]``). So an agent's model call reaches the same
handler with the same request whether it came in process, over loopback HTTP or over a pipe, and
the samples are the same. ``POST /v1/responses`` (the Responses API) goes the same way through
`arl.intercept.responses.respond` (the chat request it becomes reaches the same handler); its
stream is the Responses API's ``event:``/``data:`` events, without ``[DONE]``.

There is no routing: a pipe belongs to one episode, so ``handler`` and ``episode_key`` are bound
by whoever owns it (`responder`). Failures are answered, never raised, with the server's table:
404 unknown route (its message lists `ENDPOINTS`, after what to use instead for the routes
frameworks call that arl does not serve, `UNSERVED`: ``/v1/completions``, ``/v1/conversations``), 405 wrong method, 400 body not JSON, not
UTF-8, holding a string that is not valid Unicode (`invalid_unicode`: the field named), or not a
valid request, 413 body over ``max_body``, an `InterceptError`'s own status, 500 for anything
else the handler raises.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from arl.intercept.client import Handler
from arl.intercept.protocol import (
    BadRequest,
    ChatRequest,
    InterceptError,
    PayloadTooLarge,
    completion_chunks,
    error_body,
    parse_request,
    sse_events,
)
from arl.intercept.responses import RESPONSES_PATH, respond, response_events, sse_response_events

MAX_BODY = 4 * 2**20  # the same request-size limit as ProxyServer's default client_max_size
CHAT_PATH, MODELS_PATH = "/v1/chat/completions", "/v1/models"
ENDPOINTS = (("POST", CHAT_PATH), ("POST", RESPONSES_PATH), ("GET", MODELS_PATH), ("GET", MODELS_PATH + "/{model}"))
POST_PATHS = frozenset({CHAT_PATH, RESPONSES_PATH})  # the routes a handler answers
# OpenAI routes that frameworks call by default and arl does not serve, with what to use instead
# (their 404 says it before the list of endpoints; the path and everything under it).
# /v1/completions: a raw-text prompt has no messages, and the tracker keeps an episode's tokens by
# message (a generated reply found again by its key, never re-tokenized); a text prompt that
# re-sends an earlier reply as text would re-tokenize it, so the sample would not hold the sampled tokens.
UNSERVED = {
    "/v1/completions": (
        "the legacy text-completions API is not served (a raw-text prompt cannot be tracked token-exact; "
        "arl tracks chat messages): use POST /v1/chat/completions (LlamaIndex's OpenAILike: pass "
        "is_chat_model=True, is_function_calling_model=True); "),
    "/v1/conversations": (
        "server-side conversations are not served: chain Responses requests with previous_response_id "
        "(arl keeps each episode's responses, so a request that sends only the new input items continues "
        "the conversation token-exact), or send the whole input; "),
}

# (method, path, body) -> (HTTP status, body): what a pull-mode runner calls per request.
Respond = Callable[[str, str, bytes], Awaitable[tuple[int, bytes]]]

_log = logging.getLogger(__name__)


@attrs.frozen
class Reply:
    """What `exchange` answers: the status and JSON body, or for a streamed reply the SSE events
    (``body`` is then their concatenation); ``request`` when the body was a valid request;
    ``unknown_path`` for a 404 on a route arl does not serve."""

    status: int
    body: bytes
    events: tuple[bytes, ...] | None = None
    request: ChatRequest | None = None
    unknown_path: bool = False


def _error(status: int, message: str, kind: str, code: str, param: str | None = None) -> Reply:
    return Reply(status, json.dumps(error_body(message, kind, code, param)).encode())


def supported_endpoints() -> str:
    return ", ".join(f"{m} {p}" for m, p in ENDPOINTS)


def route_reply(method: str, path: str, *, model_name: str = "arl") -> Reply | None:
    """The answer to every request but ``POST /v1/chat/completions`` and ``POST /v1/responses``
    (None for those): the model list, 405 for a wrong method on a known route, 404 naming the
    supported endpoints."""
    route = path.split("?", 1)[0].rstrip("/")
    if route in POST_PATHS:
        return None if method == "POST" else _error(405, f"{method} {route} is not allowed; use POST",
                                                    "invalid_request_error", "http_405")
    model = {"id": model_name, "object": "model", "created": 0, "owned_by": "arl"}
    if route == MODELS_PATH or route.startswith(MODELS_PATH + "/"):
        if method != "GET":
            return _error(405, f"{method} {route} is not allowed; use GET", "invalid_request_error", "http_405")
        if route == MODELS_PATH:
            return Reply(200, json.dumps({"object": "list", "data": [model]}).encode())
        if route[len(MODELS_PATH) + 1 :] == model_name:
            return Reply(200, json.dumps(model).encode())
        return _error(404, f"unknown model {route[len(MODELS_PATH) + 1 :][:80]!r}; this proxy serves "
                      f"{model_name!r}", "invalid_request_error", "model_not_found", "model")
    hint = next((why for prefix, why in UNSERVED.items() if route == prefix or route.startswith(prefix + "/")), "")
    return attrs.evolve(
        _error(404, f"{method} {route[:200]} is not an endpoint of the arl proxy; {hint}it serves "
               f"{supported_endpoints()}", "invalid_request_error", "unknown_endpoint"),
        unknown_path=True,
    )


MAX_PATH = 200  # characters of a field path named in an error message


def invalid_unicode(data: Any) -> str | None:
    """The path (``messages[0].content``) of the first string in parsed JSON, value or key, that is
    not valid Unicode, None when every one is. ``json.loads`` takes a lone surrogate escape
    (``"\\ud800"``), and the bytes of one (decoded ``surrogatepass``), into a ``str`` that cannot be
    encoded; whatever encodes it later (the tokenizer, the reply's serializer) then fails with a
    500, so the exchange refuses it with a 400 first. A walk without recursion; ASCII strings cost
    one ``isascii`` each."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if not _encodes(value):
                return _path_text(path)
        elif isinstance(value, dict):
            items = list(value.items())
            for key, _ in items:
                if not _encodes(key):
                    return _path_text((*path, key)) + " (a key)"
            stack.extend((item, (*path, key)) for key, item in reversed(items))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(value))))
    return None


def _encodes(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _path_text(path: tuple[Any, ...]) -> str:
    parts = []
    for part in path:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:  # a key: shortened, its own bad characters escaped so the message itself encodes
            key = part[:40].encode("utf-8", "backslashreplace").decode("utf-8")
            parts.append(f".{key}" if parts else key)
    text = "".join(parts) or "(the body)"
    return text if len(text) <= MAX_PATH else f"{text[: MAX_PATH // 2]}...{text[-MAX_PATH // 2 :]}"


async def exchange(handler: Handler, episode_key: str, method: str, path: str, body: bytes, *,
                   model_name: str = "arl", max_body: int = MAX_BODY) -> Reply:
    """The `Reply` `ProxyServer` would send for this request."""
    routed = route_reply(method, path, model_name=model_name)
    if routed is not None:
        return routed
    request = None
    try:
        if len(body) > max_body:
            raise PayloadTooLarge(f"request body too large: {len(body)} bytes exceeds {max_body}")
        try:
            data = json.loads(body)
        except UnicodeDecodeError as exc:
            raise BadRequest(f"request body is not valid UTF-8: {exc}") from None
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
        where = invalid_unicode(data)
        if where is not None:
            raise BadRequest(f"request body is not valid Unicode: {where} holds a lone surrogate (an unpaired "
                             f"\\ud800-\\udfff escape, or its UTF-8 bytes); send text as valid UTF-8", param=where)
        if path.split("?", 1)[0].rstrip("/") == RESPONSES_PATH:
            responses_request, response = await respond(handler, episode_key, data)
            request = responses_request.chat
            if responses_request.stream:
                events = tuple(sse_response_events(response_events(response)))
                return Reply(200, b"".join(events), events, request)
            return Reply(200, response.model_dump_json(exclude_unset=True).encode(), request=request)
        request = parse_request(data)
        completion = await handler(episode_key, request)
        if request.stream:
            events = tuple(sse_events(completion_chunks(completion, include_usage=request.include_usage)))
            return Reply(200, b"".join(events), events, request)
        return Reply(200, completion.model_dump_json(exclude_unset=True).encode(), request=request)
    except InterceptError as exc:
        return Reply(exc.status, json.dumps(exc.to_json()).encode(), request=request)
    except Exception as exc:  # noqa: BLE001 -- a handler bug must not take the transport down
        _log.error("chat-completions handler raised; answering 500", exc_info=True)
        return attrs.evolve(_error(500, f"handler failed: {type(exc).__name__}: {exc}", "server_error",
                                   "handler_error"), request=request)


async def answer(handler: Handler, episode_key: str, method: str, path: str, body: bytes, *,
                 model_name: str = "arl", max_body: int = MAX_BODY) -> tuple[int, bytes]:
    """The response ``(status, body)`` `ProxyServer` would send for this request (a streamed
    reply's body is its whole SSE stream: the ``openai`` client parses it whatever the content type)."""
    reply = await exchange(handler, episode_key, method, path, body, model_name=model_name, max_body=max_body)
    return reply.status, reply.body


def responder(client: Any, *, model_name: str | None = None) -> Respond:
    """`answer` bound to an `InProcessClient`'s handler and episode key: the episode's requests go to
    the handler that client calls (what `ProxyEnvManager` builds with ``transport="inprocess"``)."""
    handler, episode_key = getattr(client, "handler", None), getattr(client, "episode_key", None)
    if handler is None or episode_key is None:
        raise ValueError(f"pull mode answers through the episode's handler: give an InProcessClient "
                         f"(transport: inprocess), got {type(client).__name__}")
    return functools.partial(answer, handler, episode_key, model_name=model_name or getattr(client, "model", "arl"))


__all__ = ["CHAT_PATH", "ENDPOINTS", "MAX_BODY", "MODELS_PATH", "POST_PATHS", "RESPONSES_PATH", "UNSERVED", "Reply", "Respond", "answer",
           "exchange", "invalid_unicode", "responder", "route_reply", "supported_endpoints"]
