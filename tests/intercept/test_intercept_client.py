"""InProcessClient: the openai client's call signature and types, errors as openai exceptions."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletion

from arl.intercept import (
    ChatRequest,
    ContextLengthExceeded,
    EpisodeClosed,
    InProcessClient,
    make_completion,
    parse_request,
)
from arl.intercept.protocol import BadRequest

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def echo_handler(seen: list):
    async def handler(episode_key: str, request: ChatRequest):
        seen.append((episode_key, request))
        return make_completion(completion_id="c1", model=request.model, content="hi", finish_reason="stop",
                               prompt_tokens=3, completion_tokens=1)

    return handler


async def test_create_returns_openai_types_and_passes_fields():
    seen: list = []
    client = InProcessClient(echo_handler(seen), "key-1")
    out = await client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=7, temperature=0.5, top_p=0.9, seed=3,
        extra_body={"top_k": 5}, user="u1",
    )
    assert isinstance(out, ChatCompletion) and out.choices[0].message.content == "hi"
    assert out.usage.total_tokens == 4
    episode_key, request = seen[0]
    assert episode_key == "key-1" and request.model == "m"
    assert (request.max_tokens, request.temperature, request.top_p, request.top_k, request.seed) == (7, 0.5, 0.9, 5, 3)
    assert request.extra == {"user": "u1"} and request.noop == request.unknown == ()
    assert request.messages == tuple(MESSAGES)


async def test_pydantic_messages_are_serialized_like_the_stock_client():
    seen: list = []
    client = InProcessClient(echo_handler(seen), "e")
    first = await client.chat.completions.create(model="m", messages=MESSAGES)
    history = [*MESSAGES, first.choices[0].message, {"role": "user", "content": [{"type": "text", "text": "x"}]}]
    await client.chat.completions.create(model="m", messages=history, max_completion_tokens=4)
    request = seen[1][1]
    assert request.messages[2] == {"role": "assistant", "content": "hi"}
    assert request.messages[3] == {"role": "user", "content": "x"} and request.max_tokens == 4


@pytest.mark.parametrize(
    "error, cls, status",
    [
        (BadRequest("bad"), openai.BadRequestError, 400),
        (ContextLengthExceeded("too long"), openai.BadRequestError, 400),
        (EpisodeClosed("over"), openai.APIStatusError, 410),
        (RuntimeError("bug"), openai.InternalServerError, 500),
    ],
)
async def test_handler_errors_become_openai_exceptions(error, cls, status):
    async def handler(episode_key, request):
        raise error

    with pytest.raises(cls) as info:
        await InProcessClient(handler, "e").chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.status_code == status and info.value.__cause__ is error
    assert isinstance(info.value.body, dict) and "message" in info.value.body
    if isinstance(error, ContextLengthExceeded):
        assert info.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": [{"role": "tool", "content": "x"}]},  # no tool_call_id
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": 1}]}]},
        {"messages": MESSAGES, "n": 2},
        {"messages": MESSAGES, "stream": "yes"},
        {"messages": MESSAGES, "frequency_penalty": 0.1},
        {"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},  # no name
        {"messages": MESSAGES, "tool_choice": "required"},  # no tools to call
        {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "a"}}],
         "tool_choice": {"type": "function", "function": {"name": "b"}}},  # not among the tools
        {"messages": MESSAGES, "max_tokens": 0},
        {"messages": MESSAGES, "temperature": -1},
        {"messages": MESSAGES, "tools": [{"type": "function"}]},
    ],
)
async def test_invalid_requests_are_bad_requests(kwargs):
    seen: list = []
    with pytest.raises(openai.BadRequestError):
        await InProcessClient(echo_handler(seen), "e").chat.completions.create(model="m", **kwargs)
    assert not seen


async def test_timeout_raises_api_timeout():
    import anyio

    async def slow(episode_key, request):
        await anyio.sleep(5)

    with pytest.raises(openai.APITimeoutError):
        await InProcessClient(slow, "e").chat.completions.create(model="m", messages=MESSAGES, timeout=0.05)


def test_parse_request_normalizes_tool_calls():
    body = {"messages": [MESSAGES[1], {"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "move", "arguments": {"direction": "Up"}}}]}]}
    request = parse_request(body)
    call = request.messages[1]["tool_calls"][0]
    assert call == {"id": "c", "type": "function", "function": {"name": "move", "arguments": '{"direction": "Up"}'}}
    assert request.messages[1]["content"] == ""


class _Dict(dict):
    """A dict subclass: `normalize_message` takes its full path for it, never the fast one."""


@pytest.mark.parametrize("message", [
    {"role": r, "content": c} for r in ("system", "developer", "user", "assistant") for c in ("", "x", "é\n<a>")
] + [
    {"role": "tool", "content": "x"}, {"role": "bogus", "content": "x"}, {"role": ["user"], "content": "x"},
    {"role": "user", "content": None}, {"role": "assistant", "content": None}, {"role": "user", "name": "x"},
    {"role": "user", "content": [{"type": "text", "text": "a"}]},
])
def test_normalize_fast_path_agrees_with_the_full_checks(message):
    from arl.intercept.protocol import normalize_message

    def outcome(m):
        try:
            return normalize_message(m, 0)
        except BadRequest as exc:
            return ("error", exc.message, exc.param)

    assert outcome(message) == outcome(_Dict(message))


async def test_request_keeps_no_reference_to_the_callers_messages():
    """Plain messages are handed to the validator without a copy; what the handler gets must
    still be a snapshot, unaffected by the agent editing its history afterwards."""
    seen: list = []
    client = InProcessClient(echo_handler(seen), "e")
    history = [dict(m) for m in MESSAGES]
    await client.chat.completions.create(model="m", messages=history)
    history[1]["content"] = "edited"
    request = seen[0][1]
    assert request.messages[1] == {"role": "user", "content": "u"}
    assert all(a is not b for a, b in zip(request.messages, history, strict=True))


async def test_client_is_freed_without_the_cycle_collector():
    """No reference cycle through the client: dropping it frees it (and the handler's state, a
    proxy episode's whole tracker) at once, not at the next full garbage collection."""
    import gc
    import weakref

    seen: list = []
    client = InProcessClient(echo_handler(seen), "e")
    await client.chat.completions.create(model="m", messages=MESSAGES)
    ref = weakref.ref(client)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del client
        assert ref() is None
    finally:
        if enabled:
            gc.enable()
