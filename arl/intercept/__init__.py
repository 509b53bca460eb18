"""The function-call interception layer (docs/architecture.md §7).

Agent code calls an OpenAI-compatible ``client.chat.completions.create(...)``; the call reaches
an env manager's handler either as a plain function call (`InProcessClient`) or over loopback
HTTP (`ProxyServer`, for agents in other processes), or through an ``httpx`` transport that
calls the handler in process (`InProcessTransport`, for frameworks that take an ``openai`` client
or an ``http_client``; `SyncInProcessTransport` for synchronous ones run in a worker thread).
``client.responses.create`` (the Responses API, `arl.intercept.responses`)
is converted to the same chat path. `MessageTracker` turns the calls of one episode into exact
token sequences for training.
"""

from __future__ import annotations

from arl.intercept.client import ChunkStream, Handler, InProcessClient, openai_status_error
from arl.intercept.handler import ChatHandler, SamplingDefaults
from arl.intercept.protocol import (
    BadRequest,
    ChatRequest,
    ContextLengthExceeded,
    EngineFailure,
    EpisodeClosed,
    InterceptError,
    PayloadTooLarge,
    Unauthorized,
    UnknownEpisode,
    completion_chunks,
    make_completion,
    normalize_message,
    parse_request,
)
from arl.intercept.responses import ResponseStore, make_response, parse_responses_request, response_events
from arl.intercept.server import ProxyServer
from arl.intercept.toolcalls import parse_tool_calls
from arl.intercept.tracker import MessageTracker, TemplateError, TrackedSample

__all__ = [
    "BadRequest",
    "ChatHandler",
    "ChatRequest",
    "ChunkStream",
    "ContextLengthExceeded",
    "EngineFailure",
    "EpisodeClosed",
    "Handler",
    "InProcessClient",
    "InProcessTransport",
    "InterceptError",
    "MessageTracker",
    "PayloadTooLarge",
    "ProxyServer",
    "ResponseStore",
    "SamplingDefaults",
    "SyncInProcessTransport",
    "TemplateError",
    "TrackedSample",
    "Unauthorized",
    "UnknownEpisode",
    "completion_chunks",
    "make_completion",
    "make_response",
    "normalize_message",
    "openai_status_error",
    "parse_request",
    "parse_responses_request",
    "parse_tool_calls",
    "response_events",
]


def __getattr__(name: str) -> object:
    if name in ("InProcessTransport", "SyncInProcessTransport"):  # lazily: they import the openai client's httpx
        from arl.intercept import transport

        return getattr(transport, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
