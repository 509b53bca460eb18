"""The function-call interception layer (DESIGN.md §6).

Agent code calls an OpenAI-compatible ``client.chat.completions.create(...)``; the call reaches
an env manager's handler either as a plain function call (`InProcessClient`) or over loopback
HTTP (`ProxyServer`, for agents in other processes). `MessageTracker` turns the calls of one
episode into exact token sequences for training.
"""

from __future__ import annotations

from arl.intercept.client import Handler, InProcessClient, openai_status_error
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
    make_completion,
    normalize_message,
    parse_request,
)
from arl.intercept.server import ProxyServer
from arl.intercept.toolcalls import parse_tool_calls
from arl.intercept.tracker import MessageTracker, TemplateError, TrackedSample

__all__ = [
    "BadRequest",
    "ChatHandler",
    "ChatRequest",
    "ContextLengthExceeded",
    "EngineFailure",
    "EpisodeClosed",
    "Handler",
    "InProcessClient",
    "InterceptError",
    "MessageTracker",
    "PayloadTooLarge",
    "ProxyServer",
    "SamplingDefaults",
    "TemplateError",
    "TrackedSample",
    "Unauthorized",
    "UnknownEpisode",
    "make_completion",
    "normalize_message",
    "openai_status_error",
    "parse_request",
    "parse_tool_calls",
]
