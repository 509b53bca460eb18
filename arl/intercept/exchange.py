"""One chat-completions exchange without a web server: raw request in, status and JSON body out.

Transports that are not HTTP (pull mode's pipes, `arl/agents/pull.py`) carry an agent's raw
HTTP request to the trainer; `answer` answers it exactly as `ProxyServer` does: the body is
parsed as JSON, validated by `parse_request` (the validator every transport uses) and handed to
the episode's handler, and the completion is serialized as the server serializes it
(``model_dump_json(exclude_unset=True)``). So an agent's model call reaches the same handler with
the same request whether it came in process, over loopback HTTP or over a pipe, and the samples
are the same.

There is no routing key: a pipe belongs to one episode, so ``handler`` and ``env_id`` are bound
by whoever owns it (`responder`). Failures are answered, never raised, with the server's table:
404 unknown route, 405 wrong method, 400 body not JSON or not a valid request, 413 body over
``max_body``, an `InterceptError`'s own status, 500 for anything else the handler raises.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from arl.intercept.client import Handler
from arl.intercept.protocol import (
    BadRequest,
    InterceptError,
    PayloadTooLarge,
    error_body,
    parse_request,
)

MAX_BODY = 4 * 2**20  # the same request-size limit as ProxyServer's default client_max_size
CHAT_PATH, MODELS_PATH = "/v1/chat/completions", "/v1/models"

# (method, path, body) -> (HTTP status, JSON body): what a pull-mode runner calls per request.
Respond = Callable[[str, str, bytes], Awaitable[tuple[int, bytes]]]

_log = logging.getLogger(__name__)


def _error(status: int, message: str, kind: str, code: str) -> tuple[int, bytes]:
    return status, json.dumps(error_body(message, kind, code)).encode()


async def answer(handler: Handler, env_id: str, method: str, path: str, body: bytes, *,
                 model_name: str = "arl", max_body: int = MAX_BODY) -> tuple[int, bytes]:
    """The response ``(status, JSON bytes)`` `ProxyServer` would send for this request."""
    route = path.split("?", 1)[0].rstrip("/")
    if route == MODELS_PATH:
        if method != "GET":
            return _error(405, "Method Not Allowed", "invalid_request_error", "http_405")
        models = {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "arl"}]}
        return 200, json.dumps(models).encode()
    if route != CHAT_PATH:
        return _error(404, "Not Found", "invalid_request_error", "http_404")
    if method != "POST":
        return _error(405, "Method Not Allowed", "invalid_request_error", "http_405")
    try:
        if len(body) > max_body:
            raise PayloadTooLarge(f"request body too large: {len(body)} bytes exceeds {max_body}")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
        completion = await handler(env_id, parse_request(data))
        return 200, completion.model_dump_json(exclude_unset=True).encode()
    except InterceptError as exc:
        return exc.status, json.dumps(exc.to_json()).encode()
    except Exception as exc:  # noqa: BLE001 -- a handler bug must not take the transport down
        _log.error("chat-completions handler raised; answering 500", exc_info=True)
        return _error(500, f"handler failed: {type(exc).__name__}: {exc}", "server_error", "handler_error")


def responder(client: Any, *, model_name: str | None = None) -> Respond:
    """`answer` bound to an `InProcessClient`'s handler and env id: the episode's requests go to
    the handler that client calls (what `ProxyEnvManager` builds with ``transport="inprocess"``)."""
    handler, env_id = getattr(client, "handler", None), getattr(client, "env_id", None)
    if handler is None or env_id is None:
        raise ValueError(f"pull mode answers through the episode's handler: give an InProcessClient "
                         f"(transport: inprocess), got {type(client).__name__}")
    return functools.partial(answer, handler, env_id, model_name=model_name or getattr(client, "model", "arl"))


__all__ = ["CHAT_PATH", "MAX_BODY", "MODELS_PATH", "Respond", "answer", "responder"]
