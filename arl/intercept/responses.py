"""The OpenAI Responses API (``POST /v1/responses``) on top of the chat-completions path.

A Responses request is converted into a `ChatRequest` (`parse_responses_request`), answered by
the episode's chat handler (the one that tracks tokens), and the `ChatCompletion` it returns is
rendered as an `openai.types.responses.Response` (`make_response`), or as the stream events the
``openai`` package parses (`response_events`). So a Responses call is tracked exactly as the
chat call with the same conversation: the same prompt tokens, the engine's sampled tokens, the
same samples (an episode played through either API gives the same samples).

The conversion (input items -> chat messages):

- ``input`` a string: one user message. A list of items: ``message`` items (``type`` may be
  omitted; ``role`` user / system / developer / assistant; ``content`` a string or a list of
  ``input_text`` / ``output_text`` / ``text`` parts, joined) become messages; ``function_call``
  items (``call_id``, ``name``, ``arguments``) become tool calls of the assistant message just
  before them (a new assistant message with empty content when there is none);
  ``function_call_output`` items (``call_id``, ``output``) become ``tool`` messages. Other item
  and part types (images, files, reasoning, item references, hosted-tool calls) get a 400.
- ``instructions``: a system message in front (not carried over from a previous response, as
  OpenAI specifies).
- ``previous_response_id``: the conversation is the previous response's (without its
  instructions) + its output + the new items. The handler keeps its episode's responses
  (`ResponseStore`, ``handler.responses``; ``store: false`` keeps none), so a client that sends
  only the new items still gets one token-exact chain: the previous output is found by its key,
  not re-tokenized. An id the episode does not know gets a 400 naming ``previous_response_id``.
- ``tools``: function tools ``{type: function, name, description, parameters, strict}`` become
  chat tools (``strict``, a schema-enforcement request arl cannot honour, is a counted no-op:
  the tool's schema still reaches the template); any other tool type gets a 400.
- ``tool_choice``: ``auto`` / ``none`` honoured; ``required`` and a named function enforced by
  constrained decoding as on the chat path (a 400 on an engine without it). ``parallel_tool_calls``, ``temperature``, ``top_p``,
  ``max_output_tokens`` (-> max_tokens), ``include: ["message.output_text.logprobs"]`` (->
  log-probs on the output text), and the chat extras ``top_k``, ``seed``, ``stop`` (in
  ``extra_body``) are honoured.
- ``text.format``: ``text`` honoured; ``json_object`` / ``json_schema`` enforced as chat's
  ``response_format`` (constrained decoding; a 400 on an engine without it); ``text.verbosity`` and ``reasoning`` are counted no-ops (named in
  ``ChatRequest.noop``: the transports count and log them). ``store``, ``include`` (other
  values), ``truncation: "disabled"``, ``metadata``, ``user``, ``service_tier``,
  ``prompt_cache_key``, ``safety_identifier``, ``stream_options`` are bookkeeping no-ops.
  ``background``, ``conversation``, ``prompt``, ``max_tool_calls``, ``truncation: "auto"`` and
  ``top_logprobs`` > 0 are refused (400): the engine cannot do them. Anything else goes to the
  chat validator like any chat field (unknown fields counted there).

The reply: ``output`` holds a ``message`` item with one ``output_text`` part when the reply has
text, then one ``function_call`` item per tool call (``call_id`` = the chat tool call's id, so
the ids are the chat path's); ``status`` ``completed``, or ``incomplete`` with
``incomplete_details.reason = "max_output_tokens"`` when the engine hit max_tokens; ``usage``
in tokens.
"""

from __future__ import annotations

import functools
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import attrs

from arl.intercept.protocol import BadRequest, ChatRequest, parse_request

RESPONSES_PATH = "/v1/responses"
MAX_STORED = 4096  # responses an episode keeps for previous_response_id (oldest forgotten first)
LOGPROBS_INCLUDE = "message.output_text.logprobs"

# Responses fields consumed by the conversion; every other field goes to the chat validator.
_CONSUMED = {
    "input", "instructions", "previous_response_id", "tools", "tool_choice", "max_output_tokens", "text",
    "reasoning", "store", "include", "truncation", "stream_options", "background", "conversation", "prompt",
    "max_tool_calls", "top_logprobs",
}
_BOOKKEEPING = ("metadata", "user", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                "safety_identifier")  # chat's METADATA_FIELDS too: passed on as they are
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_ROLES = frozenset({"user", "system", "developer", "assistant"})


def _fail(message: str, param: str | None = None) -> BadRequest:
    return BadRequest(message, param=param)


@attrs.frozen
class ResponsesRequest:
    """A validated Responses request: the chat request it becomes, and what the reply needs."""

    chat: ChatRequest
    added: tuple[dict[str, Any], ...]  # the messages the request adds to its previous response's conversation
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: tuple[dict[str, Any], ...] = ()  # as sent (Responses-style), echoed in the Response
    tool_choice: Any = "auto"
    store: bool = True
    stream: bool = False


@attrs.frozen
class StoredResponse:
    previous: str | None  # the response its request continued
    added: tuple[dict[str, Any], ...]  # the messages its request added (no instructions)
    reply: dict[str, Any]  # the assistant message the tracker committed for it


class ResponseStore:
    """One episode's responses by id, for ``previous_response_id`` (at most `MAX_STORED`). Each
    keeps only the messages its request added and a link to the previous one, so an episode's
    store is linear in its length; `conversation` follows the links."""

    def __init__(self, limit: int = MAX_STORED) -> None:
        self.limit = limit
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        return self._items.get(response_id)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._items[response_id] = stored
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)

    def conversation(self, response_id: str) -> list[dict[str, Any]] | None:
        """The messages of a response's request (without instructions) + its reply; None when it,
        or a response it continued, is not kept."""
        chain: list[StoredResponse] = []
        current: str | None = response_id
        while current is not None:
            stored = self._items.get(current)
            if stored is None:
                return None
            chain.append(stored)
            current = stored.previous
        out: list[dict[str, Any]] = []
        for stored in reversed(chain):
            out += stored.added
            out.append(stored.reply)
        return out


# -- request --------------------------------------------------------------------------------------


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(f"{where}.content must be a string or a list of text parts", where)
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image":
            raise _fail(f"{where}.content[{k}] of type 'input_image' is not supported: arl's Responses API reads "
                        "text parts only; send images as image_url parts (data URLs) through POST /v1/chat/completions",
                        where)
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            what = f"of type {kind!r} " if isinstance(kind, str) else ""
            raise _fail(f"{where}.content[{k}] {what}is not supported: arl's model reads text parts only "
                        "('input_text' / 'output_text' with a string 'text')", where)
        texts.append(part["text"])
    return "".join(texts)


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Responses input items as chat messages (the conversion in the module doc)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise _fail("input must be a string or a list of input items", "input")
    out: list[dict[str, Any]] = []
    for k, item in enumerate(items):
        where = f"input[{k}]"
        if not isinstance(item, dict):
            raise _fail(f"{where} must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _fail(f"{where}.role must be one of {sorted(_ROLES)}, got {str(role)[:40]!r}", where)
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise _fail(f"{where} (function_call) needs string 'call_id', 'name' and 'arguments'", where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _fail(f"{where}.call_id must be a string", where)
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(output, where + ".output")})
        else:
            raise _fail(f"{where}: input items of type {str(kind)[:40]!r} are not supported; arl takes "
                        "'message', 'function_call' and 'function_call_output' items", where)
    return out


def _chat_tool(tool: Any, k: int) -> dict[str, Any]:
    where = f"tools[{k}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise _fail(f"{where}: tools of type {str(kind)[:40]!r} are not supported; arl's model calls "
                    "function tools {'type': 'function', 'name', 'parameters'} only", where)
    if not isinstance(tool.get("name"), str):
        raise _fail(f"{where}.name must be a string", where)
    function = {"name": tool["name"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    if tool.get("parameters") is not None:
        function["parameters"] = tool["parameters"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":  # the chat validator refuses it
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return choice
    raise _fail("tool_choice must be 'auto', 'none', 'required' or a named function tool", "tool_choice")


_REFUSED = {
    "background": "background responses are not supported: the call answers when the reply is generated",
    "conversation": ("server-side conversations (the Conversations API) are not supported: chain requests with "
                     "previous_response_id (arl keeps each episode's responses, so a request that sends only the "
                     "new input items continues the conversation token-exact), or send the whole input"),
    "prompt": "stored prompt templates are not supported: send instructions and input",
    "max_tool_calls": "the engine cannot limit the number of tool calls (parallel_tool_calls: false allows one)",
}


def parse_responses_request(body: Any, store: ResponseStore | None = None) -> ResponsesRequest:
    """Validate a Responses body and convert it to a `ChatRequest` (module doc). ``store``: the
    episode's responses, for ``previous_response_id``. Raises `BadRequest` naming the field."""
    if not isinstance(body, dict):
        raise _fail("the request body must be a JSON object")
    get = body.get
    for field, why in _REFUSED.items():
        if get(field) not in (None, False):
            raise _fail(f"{field} is not supported: {why}; omit it", field)
    if get("top_logprobs") not in (None, 0):
        raise _fail("top_logprobs > 0 is not supported: arl's engines return only the sampled token's log-prob "
                    f"(include {LOGPROBS_INCLUDE!r})", "top_logprobs")
    if get("truncation") not in (None, "disabled"):
        raise _fail("truncation 'auto' is not supported: arl never drops input items (a prompt too long for "
                    "the context is refused); send truncation 'disabled' or omit it", "truncation")
    instructions = get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _fail("instructions must be a string", "instructions")
    if get("input") is None and get("previous_response_id") is None:
        raise _fail("input is required", "input")
    new = input_messages(get("input") if get("input") is not None else [])
    previous_id = get("previous_response_id")
    conversation = new
    if previous_id is not None:
        if not isinstance(previous_id, str):
            raise _fail("previous_response_id must be a string", "previous_response_id")
        previous = store.conversation(previous_id) if store is not None else None
        if previous is None:
            where = "this episode's responses" if store is not None else "a handler that keeps no responses"
            raise _fail(f"previous response {previous_id[:80]!r} is not in {where} (store: false responses are "
                        "not kept); send the whole input instead", "previous_response_id")
        conversation = [*previous, *new]
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    if not messages:
        raise _fail("input must not be empty", "input")
    tools = get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _fail("tools must be a list", "tools")
    chat_tools = [_chat_tool(t, k) for k, t in enumerate(tools or ())]
    noop: list[str] = []
    if any(isinstance(t, dict) and t.get("strict") for t in tools or ()):
        noop.append("tools.strict")
    text = get("text")
    if text is not None and not isinstance(text, dict):
        raise _fail("text must be an object {'format': {...}, 'verbosity': ...}", "text")
    text = text or {}
    fmt = text.get("format")
    response_format = None
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise _fail("text.format must be an object {'type': 'text' | 'json_object' | 'json_schema'}", "text")
        response_format = {"type": fmt.get("type")}
        if fmt.get("type") == "json_schema":  # Responses flattens what chat nests under "json_schema"
            if not isinstance(fmt.get("name"), str):  # chat's message would name its nested field
                raise _fail("text.format of type json_schema needs a string 'name' beside its 'schema'", "text")
            response_format["json_schema"] = {k: v for k, v in fmt.items() if k != "type"}
    if get("reasoning") is not None:
        noop.append("reasoning")
    include = get("include")
    if include is not None and not (isinstance(include, list) and all(isinstance(x, str) for x in include)):
        raise _fail("include must be a list of strings", "include")
    store_flag = get("store")
    if store_flag is not None and not isinstance(store_flag, bool):
        raise _fail("store must be a boolean", "store")
    chat_body = {k: v for k, v in body.items() if k not in _CONSUMED}
    chat_body.update(messages=messages, tools=chat_tools or None, tool_choice=_chat_tool_choice(get("tool_choice")),
                     max_tokens=get("max_output_tokens"), response_format=response_format)
    if text.get("verbosity") is not None:
        chat_body["verbosity"] = text["verbosity"]  # a chat NOOP_FIELD: counted there
    if include and LOGPROBS_INCLUDE in include:
        chat_body["logprobs"] = True
    try:
        chat = parse_request(chat_body)
    except BadRequest as exc:  # name the Responses field, not the chat one it became
        param = {"max_tokens": "max_output_tokens", "response_format": "text", "messages": "input"}.get(
            exc.param or "", exc.param)
        message = exc.message.replace("response_format", "text.format").replace("max_tokens", "max_output_tokens")
        raise BadRequest(message, param=param) from None
    if noop:
        chat = attrs.evolve(chat, noop=chat.noop + tuple(noop))
    return ResponsesRequest(
        chat=chat, added=tuple(chat.messages[len(chat.messages) - len(new):]),
        instructions=instructions, previous_response_id=previous_id, tools=tuple(tools or ()),
        tool_choice=get("tool_choice") if get("tool_choice") is not None else "auto",
        store=store_flag is not False, stream=chat.stream,
    )


# -- response -------------------------------------------------------------------------------------


@functools.cache
def _types() -> Any:
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    return Response, TypeAdapter(ResponseStreamEvent)


def reply_message(completion: Any) -> dict[str, Any]:
    """The assistant message of a `ChatCompletion`, as the tracker committed it."""
    message = completion.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in message.tool_calls]
    return out


def _response_dict(completion: Any, request: ResponsesRequest, response_id: str) -> dict[str, Any]:
    choice = completion.choices[0]
    message = choice.message
    incomplete = choice.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    output: list[dict[str, Any]] = []
    if message.content:
        part: dict[str, Any] = {"type": "output_text", "text": message.content, "annotations": []}
        if choice.logprobs is not None and choice.logprobs.content is not None:
            part["logprobs"] = [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes or [], "top_logprobs": []}
                                for t in choice.logprobs.content]
        output.append({"id": f"msg_{response_id[5:]}", "type": "message", "role": "assistant", "status": status,
                       "content": [part]})
    for k, call in enumerate(message.tool_calls or ()):
        output.append({"id": f"fc_{response_id[5:]}_{k}", "type": "function_call", "call_id": call.id,
                       "name": call.function.name, "arguments": call.function.arguments, "status": "completed"})
    usage = completion.usage
    chat = request.chat
    created = float(completion.created)
    return {
        "id": response_id, "object": "response", "created_at": created, "completed_at": created,
        "model": completion.model, "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
        "instructions": request.instructions, "output": output,
        "parallel_tool_calls": chat.parallel_tool_calls is not False, "tool_choice": request.tool_choice,
        "tools": [dict(t) for t in request.tools], "temperature": chat.temperature, "top_p": chat.top_p,
        "max_output_tokens": chat.max_tokens, "previous_response_id": request.previous_response_id,
        "store": request.store, "text": {"format": {"type": "text"}},
        "usage": None if usage is None else {
            "input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens,
        },
    }


def make_response(completion: Any, request: ResponsesRequest, response_id: str | None = None) -> Any:
    """The `openai.types.responses.Response` for a chat handler's `ChatCompletion` (module doc)."""
    response_id = response_id or f"resp_{uuid.uuid4().hex}"
    return _types()[0].model_validate(_response_dict(completion, request, response_id))


def response_events(response: Any) -> list[Any]:
    """A finished `Response` as the stream events a Responses server sends for it (what
    ``stream: true`` gets), in OpenAI's order, numbered from 0: ``response.created`` and
    ``response.in_progress`` (the response with no output, status in_progress); per output item
    ``response.output_item.added``, then for a message ``response.content_part.added``,
    ``response.output_text.delta`` (the whole text), ``response.output_text.done``,
    ``response.content_part.done``, for a function call ``response.function_call_arguments.delta``
    and ``.done``; ``response.output_item.done``; last ``response.completed`` (or
    ``response.incomplete``) with the whole response. The reply is generated whole first, so
    the tracked tokens are exactly the sampled ones."""
    full = response.model_dump(mode="json", exclude_unset=True)
    pending = {**full, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    pending.pop("completed_at", None)
    events: list[dict[str, Any]] = [{"type": "response.created", "response": pending},
                                    {"type": "response.in_progress", "response": pending}]
    for index, item in enumerate(full["output"]):
        head = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress", "content": []}})
            for c, part in enumerate(item["content"]):
                lps = part.get("logprobs") or []
                events += [
                    {"type": "response.content_part.added", **head, "content_index": c,
                     "part": {"type": "output_text", "text": "", "annotations": []}},
                    {"type": "response.output_text.delta", **head, "content_index": c, "delta": part["text"],
                     "logprobs": lps},
                    {"type": "response.output_text.done", **head, "content_index": c, "text": part["text"],
                     "logprobs": lps},
                    {"type": "response.content_part.done", **head, "content_index": c, "part": part},
                ]
        else:
            events += [
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "arguments": "", "status": "in_progress"}},
                {"type": "response.function_call_arguments.delta", **head, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **head, "arguments": item["arguments"],
                 "name": item["name"]},
            ]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    last = "response.incomplete" if full.get("status") == "incomplete" else "response.completed"
    events.append({"type": last, "response": full})
    validate = _types()[1].validate_python
    return [validate({**e, "sequence_number": n}) for n, e in enumerate(events)]


def sse_response_events(events: Sequence[Any]) -> list[bytes]:
    """Server-sent events of `response_events`: ``event: <type>`` and ``data: <JSON>`` each (the
    Responses API sends no ``[DONE]``)."""
    return [b"event: " + e.type.encode() + b"\ndata: " + e.model_dump_json(exclude_unset=True).encode() + b"\n\n"
            for e in events]


async def respond(handler: Any, episode_key: str, body: Any) -> tuple[ResponsesRequest, Any]:
    """Answer a Responses body with the episode's chat handler: ``(request, Response)``. The
    handler's `ResponseStore` (``handler.responses``, when it has one) resolves
    ``previous_response_id`` and keeps the response unless ``store`` is false."""
    store = getattr(handler, "responses", None)
    store = store if isinstance(store, ResponseStore) else None
    request = parse_responses_request(body, store)
    completion = await handler(episode_key, request.chat)
    response = make_response(completion, request)
    if store is not None and request.store:
        store.put(response.id, StoredResponse(request.previous_response_id, request.added, reply_message(completion)))
    return request, response


__all__ = ["LOGPROBS_INCLUDE", "MAX_STORED", "RESPONSES_PATH", "ResponseStore", "ResponsesRequest", "StoredResponse",
           "input_messages", "make_response", "parse_responses_request", "respond", "response_events",
           "reply_message", "sse_response_events"]
