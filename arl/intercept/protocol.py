"""The OpenAI chat-completions wire format as arl's interception layer speaks it.

One request record (`ChatRequest`), one validator (`parse_request`) and one response builder
(`make_completion`), shared by the in-process client and the HTTP proxy so that both transports
accept and reject exactly the same requests and return the same `openai` response types.

Errors are `InterceptError`s carrying an HTTP status and OpenAI's error JSON shape
(``{"error": {"message", "type", "param", "code"}}``). The HTTP server sends them as they are;
`InProcessClient` raises the `openai` exception the stock client would raise for that response
(`openai.BadRequestError` for 400, ...), so agent code sees the same errors on both transports.

Every request field is honoured or refused, never silently dropped:

- **Honoured**: ``messages``, ``model``, ``tools``, ``tool_choice`` ``"auto"`` / ``"none"`` (tool
  calls are then not parsed), ``max_tokens`` / ``max_completion_tokens``, ``temperature``,
  ``top_p``, ``top_k``, ``seed``, ``n`` (1), ``stop`` (strings of any length: `ChatHandler` cuts
  the reply at the first match), ``stream`` and ``stream_options.include_usage``
  (`completion_chunks`), ``logprobs``, ``parallel_tool_calls`` (``false``: the reply is cut after
  its first tool call, see `ChatHandler`); ``image_url`` content parts in user messages, inline
  PNG/JPEG data URLs only (an http(s) URL is refused: arl fetches nothing from the network), shown
  to a VLM policy through its engine's image renderer (`ChatHandler`; docs/guide.md "Image
  observations"); their ``detail`` is accepted and has no effect.
- **Enforced by constrained decoding** (`output_constraint`: an `OutputConstraint` the engine
  applies while it samples, vLLM's structured outputs; on an engine without constrained decoding,
  a 400 naming the field, since an unenforced constraint would train on replies the agent did not
  ask for): ``response_format`` ``json_object`` / ``json_schema`` (the reply is a JSON object /
  matches the schema), ``tool_choice`` ``"required"`` (at least one ``<tool_call>`` block whose
  arguments match the tool's ``parameters``; only one with ``parallel_tool_calls: false``) and a
  named tool (the reply is exactly one call of it; the name must be one of ``tools``).
- **Refused with a 400 naming the field**, because the engine cannot do them (no penalties, no
  top-k log-probs): ``tool_choice`` of type ``allowed_tools``, ``response_format`` together with a
  forcing ``tool_choice`` (they contradict each other), and (`REFUSED`) vLLM's ``guided_*`` /
  ``structured_outputs`` extras (send ``response_format`` / ``tool_choice`` instead), non-zero
  ``frequency_penalty`` / ``presence_penalty``, ``repetition_penalty`` other than 1, non-zero
  ``min_p``, a non-empty ``logit_bias``, ``top_logprobs`` > 0, ``modalities`` other than
  ``["text"]``, ``audio``, ``prediction``, ``web_search_options``, the deprecated ``functions`` /
  ``function_call``. Malformed values of honoured fields are refused the same way.
- **Documented no-ops**: bookkeeping fields that cannot change the reply (`METADATA_FIELDS`:
  ``user``, ``metadata``, ``store``, ``service_tier``, ...; and ``stream_options`` on a request
  that does not stream, its ``include_obfuscation``); reasoning-model fields
  (`NOOP_FIELDS`: ``reasoning_effort``, ``verbosity``) are accepted but *warned*: their names are
  in ``ChatRequest.noop`` and the transports count them (``ProxyServer.stats``,
  ``ChatHandler.stats``) and log each name once. Any other field is kept in ``ChatRequest.extra``,
  named in ``ChatRequest.unknown``, counted and logged the same way.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import attrs

from arl.engine.base import OutputConstraint
from arl.intercept.toolcalls import tool_call_tag

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_PLAIN_ROLES = ROLES - {"tool"}  # roles a message may have with nothing but role and content
MAX_N = 1  # one completion per request: a tracker records one response per prompt


# -- errors ---------------------------------------------------------------------------------------


class InterceptError(Exception):
    """A request the interception layer refuses; `status` is the HTTP status it maps to."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param

    def to_json(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)


class BadRequest(InterceptError):
    status, type, code = 400, "invalid_request_error", "invalid_request"


class ContextLengthExceeded(BadRequest):
    """The prompt plus max_tokens does not fit the model's context (OpenAI's own code)."""

    code = "context_length_exceeded"


class Unauthorized(InterceptError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class UnknownEpisode(InterceptError):
    status, type, code = 404, "not_found_error", "unknown_episode_key"


class EpisodeClosed(InterceptError):
    """The request's episode has ended; nothing will be generated for it any more."""

    status, type, code = 410, "episode_closed", "episode_closed"


class PayloadTooLarge(InterceptError):
    status, type, code = 413, "invalid_request_error", "payload_too_large"


class SlowBody(InterceptError):
    """The request body did not arrive in time (`ProxyServer`'s ``body_timeout``)."""

    status, type, code = 408, "invalid_request_error", "request_timeout"


class ServerBusy(InterceptError):
    """Too many request bodies being read at once (`ProxyServer`'s ``max_pending_bodies``)."""

    status, type, code = 503, "server_error", "server_busy"


class EngineFailure(InterceptError):
    """The engine failed the request (the episode ends with exit reason "engine_error")."""

    status, type, code = 500, "server_error", "engine_error"


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# -- the request ----------------------------------------------------------------------------------


@attrs.frozen
class ChatRequest:
    """A validated chat-completions request. Messages are normalized (see `normalize_message`);
    sampling fields are None when the agent did not set them (the handler picks defaults)."""

    messages: tuple[dict[str, Any], ...]
    model: str = "arl"
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: Any = None  # None, "auto", "none", "required" or {"type": "function", "function": {"name"}}
    response_format: dict[str, Any] | None = None  # json_object / json_schema (normalized); None: text
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk carries the usage
    parallel_tool_calls: bool | None = None  # False: at most one tool call per reply
    noop: tuple[str, ...] = ()  # NOOP_FIELDS the request set (accepted, not acted on: counted)
    unknown: tuple[str, ...] = ()  # fields arl does not know (kept in `extra`: counted)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)  # fields not acted on, as sent


def _fail(message: str, param: str | None = None) -> BadRequest:
    return BadRequest(message, param=param)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


def _text_content(content: Any, where: str, *, allow_none: bool) -> str | None:
    """Content as a string: a string, or a list of text parts (joined). None where allowed."""
    if content is None:
        if allow_none:
            return None
        raise _fail(f"{where}.content is required", where)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                if isinstance(part, dict) and part.get("type") == "image_url":
                    raise _fail(f"{where}.content[{k}]: image parts are accepted in user messages only", where)
                raise _fail(f"{where}.content[{k}] must be a text part {{'type': 'text', 'text': str}}", where)
            texts.append(part["text"])
        return "".join(texts)
    raise _fail(f"{where}.content must be a string or a list of text parts", where)


# The media types an image_url data URL may have: what the chat API documents (PNG, JPEG).
IMAGE_MEDIA_TYPES = ("image/png", "image/jpeg", "image/jpg")
IMAGE_DETAILS = ("auto", "low", "high")


def _image_url(part: dict[str, Any], where: str) -> str:
    """The data URL of an ``image_url`` content part (validated: PNG/JPEG, base64, inline)."""
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec  # some clients send the URL itself
    if not isinstance(url, str):
        raise _fail(f"{where}.image_url must be an object {{'url': 'data:image/png;base64,...'}}", where)
    if isinstance(spec, dict) and spec.get("detail") is not None and spec["detail"] not in IMAGE_DETAILS:
        raise _fail(f"{where}.image_url.detail must be one of {list(IMAGE_DETAILS)}", where)
    head = url[:64].split(",", 1)[0].lower()
    if head.startswith(("http://", "https://")):
        raise _fail(f"{where}.image_url.url is a web address: arl's proxy fetches nothing from the network; send "
                    "the image inline as a data URL (data:image/png;base64,...)", where)
    media = head[len("data:"):].split(";", 1)[0] if head.startswith("data:") else None
    if media not in IMAGE_MEDIA_TYPES:
        raise _fail(f"{where}.image_url.url must be a PNG or JPEG data URL (data:image/png;base64,... or "
                    f"data:image/jpeg;base64,...), got {url[:40]!r}", where)
    if not head.endswith(";base64") or "," not in url[:80]:
        raise _fail(f"{where}.image_url.url must be base64 (data:{media};base64,...)", where)
    return url


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A user message's content: as `_text_content`, or, when it holds ``image_url`` parts, its
    parts in order as ``{"type": "text", "text"}`` and ``{"type": "image_url", "image_url": {"url"}}``
    (the data URL checked; ``detail`` is accepted and has no effect: the model's processor sizes
    every image the same way)."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "image_url"
                                                for p in content):
        return _text_content(content, where, allow_none=False)  # type: ignore[return-value]
    parts: list[dict[str, Any]] = []
    for k, part in enumerate(content):
        at = f"{where}.content[{k}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(part, at)}})
        elif kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        else:
            raise _fail(f"{at} must be a text part {{'type': 'text', 'text': str}} or an image part "
                        "{'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,...'}}", where)
    return parts


def message_images(message: dict[str, Any]) -> tuple[str, ...]:
    """The data URLs of a normalized message's image parts, in order (none for text content).

    >>> message_images({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]})
    ('data:x',)
    """
    content = message.get("content")
    if type(content) is str or not content:
        return ()
    return tuple(p["image_url"]["url"] for p in content if p.get("type") == "image_url")


def message_text(message: dict[str, Any]) -> str:
    """A normalized message's text: its content, or the text of its parts joined (images left out).

    >>> message_text({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]})
    'a'
    """
    content = message["content"]
    if type(content) is str:
        return content
    return "".join(p["text"] for p in content if p.get("type") == "text")


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise _fail(f"{where} must be an object", where)
    if call.get("type", "function") != "function":
        raise _fail(f"{where}.type must be 'function'", where)
    if not isinstance(call.get("id"), str):
        raise _fail(f"{where}.id must be a string", where)
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _fail(f"{where}.function must be an object with a string 'name'", where)
    arguments = function.get("arguments", "")
    if isinstance(arguments, dict):  # lenient: some agents send the object itself
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str):
        raise _fail(f"{where}.function.arguments must be a JSON string", where)
    return {"id": call["id"], "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def normalize_message(message: Any, index: int) -> dict[str, Any]:
    """Validate one message and return its canonical form.

    Canonical: ``role``; ``content`` a string ("" for an assistant message with no content), or
    for a user message with ``image_url`` parts its list of text and image parts (`_user_content`);
    assistant ``tool_calls`` (when any) as ``{id, type, function: {name, arguments: str}}``;
    ``tool_call_id`` on tool messages; ``name`` when given. Other keys are dropped.
    """
    if type(message) is dict and len(message) == 2:
        # Fast path: the common ``{"role": ..., "content": str}`` with a role that needs no other
        # key. It returns what the checks below return; it only skips them (each request re-sends,
        # and so re-validates, the whole history).
        role, content = message.get("role"), message.get("content")
        if type(content) is str and type(role) is str and role in _PLAIN_ROLES:
            return {"role": role, "content": content}
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _fail(f"{where} must be an object", where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise _fail(f"{where}.role must be one of {sorted(ROLES)}, got {str(role)[:40]!r}", where)
    out: dict[str, Any] = {"role": role}
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise _fail(f"{where}.tool_calls must be a list", where)
        out["content"] = _text_content(message.get("content"), where, allow_none=True) or ""
        if calls:
            out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)]
    elif role == "user":
        out["content"] = _user_content(message.get("content"), where)
    else:
        out["content"] = _text_content(message.get("content"), where, allow_none=False)
        if role == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise _fail(f"{where}.tool_call_id must be a string", where)
            out["tool_call_id"] = message["tool_call_id"]
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise _fail(f"{where}.name must be a string", where)
        out["name"] = name
    return out


def _tool(tool: Any, k: int) -> dict[str, Any]:
    where = f"tools[{k}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise _fail(f"{where} must be a function tool {{'type': 'function', 'function': {{...}}}}", where)
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _fail(f"{where}.function must be an object with a string 'name'", where)
    if "parameters" in function and not isinstance(function["parameters"], dict):
        raise _fail(f"{where}.function.parameters must be an object", where)
    return {"type": "function", "function": function}


_KNOWN = {
    "messages", "model", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "seed", "n", "stop", "stream", "stream_options", "logprobs",
    "parallel_tool_calls", "response_format",
}
# Accepted, and do nothing: reasoning-model settings (no reasoning budget to set). Counted, warned.
NOOP_FIELDS = frozenset({"reasoning_effort", "verbosity"})
# Accepted, and do nothing: bookkeeping that cannot change the reply. Documented, not warned.
METADATA_FIELDS = frozenset({
    "user", "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
    "safety_identifier",
})
# vLLM's own constraint extras: refused, pointing to the OpenAI fields that say the same.
_CONSTRAINED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
# field -> (is this value the no-op default?, why it is refused otherwise)
REFUSED: dict[str, tuple[Any, str]] = {
    "frequency_penalty": (lambda v: v == 0, "arl's engines apply no frequency penalty"),
    "presence_penalty": (lambda v: v == 0, "arl's engines apply no presence penalty"),
    "repetition_penalty": (lambda v: v == 1, "arl's engines apply no repetition penalty"),
    "min_p": (lambda v: v == 0, "arl's engines do not truncate with min_p"),
    "logit_bias": (lambda v: not v, "arl's engines apply no logit bias"),
    "top_logprobs": (lambda v: v == 0, "arl's engines return only the sampled token's log-prob (logprobs: true)"),
    "modalities": (lambda v: v == ["text"], "arl replies with text only"),
    "audio": (lambda v: False, "arl replies with text only"),
    "prediction": (lambda v: False, "predicted outputs are not supported"),
    "web_search_options": (lambda v: False, "arl's model has no web search"),
    "functions": (lambda v: False, "the deprecated 'functions' is not supported: send 'tools'"),
    "function_call": (lambda v: False, "the deprecated 'function_call' is not supported: send 'tool_choice'"),
    **{k: (lambda v: False, "send the constraint as response_format (json_object, json_schema) or tool_choice "
                             "(required, a named tool); arl enforces those") for k in _CONSTRAINED},
}


def _tool_choice(choice: Any, tools: tuple[dict[str, Any], ...] | None) -> Any:
    """``"auto"``, ``"none"``, ``"required"`` (needs tools) or unset; a named tool (one of the
    request's tools) is returned as ``{"type": "function", "function": {"name": ...}}``."""
    if choice is None or choice in ("auto", "none"):
        return choice
    names = [t["function"]["name"] for t in tools or ()]
    if choice == "required":
        if not names:
            raise _fail("tool_choice 'required' needs tools", "tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        raise _fail("tool_choice of type 'allowed_tools' is not supported: send the allowed tools as 'tools' "
                    "with tool_choice 'auto' or 'required'", "tool_choice")
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise _fail("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
                    "{'name': str}}", "tool_choice")
    if name not in names:
        raise _fail(f"tool_choice names the tool {name!r}, which is not among the request's tools {names}",
                    "tool_choice")
    return {"type": "function", "function": {"name": name}}


def _response_format(value: Any) -> dict[str, Any] | None:
    """``{"type": "text"}`` (or unset: None), ``{"type": "json_object"}``, or ``{"type": "json_schema",
    "json_schema": {"name": str, "schema": dict, ...}}`` (normalized: the schema defaults to any object)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _fail("response_format.json_schema must be an object with a string 'name'", "response_format")
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise _fail("response_format.json_schema.schema must be an object (a JSON schema)", "response_format")
        return {"type": "json_schema", "json_schema": {**spec, "schema": schema}}
    raise _fail("response_format must be an object {'type': 'text' | 'json_object' | 'json_schema'}",
                "response_format")


def output_constraint(request: ChatRequest) -> OutputConstraint | None:
    """The constraint the engine must enforce for ``request`` (None: none). ``response_format``
    json_object / json_schema constrains the whole reply; ``tool_choice`` ``"required"`` or a named
    tool forces ``<tool_call>`` blocks (`tool_call_tag`). Both at once contradict each other (a
    reply cannot be a bare JSON object and a tool call): a 400."""
    fmt, choice = request.response_format, request.tool_choice
    forced = choice == "required" or isinstance(choice, dict)
    if fmt is not None and forced:
        raise _fail("response_format and a tool_choice that forces a tool call contradict each other: a reply "
                    "cannot be both a JSON document and a tool call; send one of them", "response_format")
    if forced:
        name = choice["function"]["name"] if isinstance(choice, dict) else None
        return OutputConstraint("structural_tag", tool_call_tag(request.tools or (), name,
                                                                parallel=request.parallel_tool_calls is not False))
    if fmt is None:
        return None
    if fmt["type"] == "json_object":
        return OutputConstraint("json_object")
    return OutputConstraint("json_schema", fmt["json_schema"]["schema"])


def _refused(body: dict[str, Any]) -> None:
    for field, (harmless, why) in REFUSED.items():
        value = body.get(field)
        if value is not None and not harmless(value):
            raise _fail(f"{field}={str(value)[:60]} is not supported: {why}; omit it", field)


def parse_request(body: Any) -> ChatRequest:
    """Validate a chat-completions body (the JSON the stock client sends; ``extra_body`` fields
    at the top level, ``null`` meaning unset). Raises `BadRequest` with the offending field.
    Which fields are honoured, refused or no-ops: the module doc."""
    if not isinstance(body, dict):
        raise _fail("the request body must be a JSON object")
    get = body.get
    messages = get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("messages must be a non-empty list", "messages")
    normalized = tuple(normalize_message(m, i) for i, m in enumerate(messages))
    model = get("model") if get("model") is not None else "arl"
    if not isinstance(model, str):
        raise _fail("model must be a string", "model")
    tools = get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _fail("tools must be a list", "tools")
        tools = tuple(_tool(t, k) for k, t in enumerate(tools)) or None
    tool_choice = _tool_choice(get("tool_choice"), tools)
    response_format = _response_format(get("response_format"))
    stream, stream_options = get("stream"), get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise _fail("stream must be a boolean", "stream")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _fail("stream_options must be an object", "stream_options")
    include_usage = (stream_options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise _fail("stream_options.include_usage must be a boolean", "stream_options")
    parallel = get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _fail("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    max_tokens = get("max_completion_tokens") if get("max_completion_tokens") is not None else get("max_tokens")
    if max_tokens is not None and not (_is_int(max_tokens) and max_tokens >= 1):
        raise _fail("max_tokens must be an integer >= 1", "max_tokens")
    temperature, top_p, top_k, seed, n = get("temperature"), get("top_p"), get("top_k"), get("seed"), get("n")
    if temperature is not None and not (_is_number(temperature) and 0 <= temperature <= 2):
        raise _fail("temperature must be a number in [0, 2]", "temperature")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise _fail("top_p must be a number in (0, 1]", "top_p")
    if top_k is not None and not (_is_int(top_k) and top_k >= -1):
        raise _fail("top_k must be an integer >= -1 (0 or -1: disabled)", "top_k")
    if seed is not None and not _is_int(seed):
        raise _fail("seed must be an integer", "seed")
    if n is not None and not (_is_int(n) and 1 <= n <= MAX_N):
        raise _fail(f"n must be an integer in [1, {MAX_N}]", "n")
    stop = get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise _fail("stop must be a non-empty string or a list of non-empty strings", "stop")
    logprobs = get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise _fail("logprobs must be a boolean", "logprobs")
    extra = {k: v for k, v in body.items() if k not in _KNOWN}
    noop: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    if extra:
        _refused(extra)
        noop = tuple(k for k in extra if k in NOOP_FIELDS and extra[k] is not None)
        unknown = tuple(k for k in extra if k not in NOOP_FIELDS and k not in METADATA_FIELDS and k not in REFUSED
                        and extra[k] is not None)
    return ChatRequest(
        messages=normalized, model=model, tools=tools, tool_choice=tool_choice,
        response_format=response_format, max_tokens=max_tokens, temperature=None if temperature is None else float(temperature),
        top_p=None if top_p is None else float(top_p), top_k=None if top_k is None else max(0, top_k),
        seed=seed, n=n or 1, stop=tuple(dict.fromkeys(stop or ())), logprobs=bool(logprobs),
        stream=bool(stream), include_usage=bool(stream and include_usage), parallel_tool_calls=parallel,
        noop=noop, unknown=unknown, extra=extra,
    )


# -- the response ---------------------------------------------------------------------------------


@functools.cache
def _chat_completion() -> Any:
    """openai's ChatCompletion, imported on first use (openai is heavy) and then kept: an import
    statement per reply costs more than the lookup."""
    from openai.types.chat import ChatCompletion

    return ChatCompletion


def make_completion(
    *,
    completion_id: str,
    model: str,
    content: str | None,
    tool_calls: Sequence[dict[str, Any]] = (),
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    token_logprobs: Sequence[tuple[str, float]] | None = None,
) -> Any:
    """An `openai.types.chat.ChatCompletion` with one choice (openai is imported lazily: heavy).

    Built by validating one nested dict: a single call into pydantic-core, about half the cost of
    constructing the message, choice, usage and completion models one by one, same result (the
    same fields set, tool calls as ``ChatCompletionMessageFunctionToolCall``)."""
    calls = [
        {"id": c["id"], "type": "function",
         "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
        for c in tool_calls
    ]
    logprobs = None
    if token_logprobs is not None:
        logprobs = {"content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t, lp in token_logprobs
        ]}
    return _chat_completion().model_validate({
        "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{
            "index": 0, "finish_reason": finish_reason, "logprobs": logprobs,
            "message": {"role": "assistant", "content": content, "tool_calls": calls or None},
        }],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


@functools.cache
def _chunk_type() -> Any:
    from openai.types.chat import ChatCompletionChunk

    return ChatCompletionChunk


def completion_chunks(completion: Any, *, include_usage: bool = False) -> list[Any]:
    """A finished `ChatCompletion` as the `openai.types.chat.ChatCompletionChunk`s a streaming
    server sends for it (what ``stream: true`` gets, in process and over HTTP).

    The reply is generated whole first, so the tracked tokens are exactly the sampled ones; the
    chunks then carry it in OpenAI's order: the role (``content: ""``, or null for a reply of tool
    calls only), the content in one delta, per tool call a delta with its ``index``, ``id``,
    ``type`` and ``name`` (``arguments: ""``) then one with its arguments, an empty delta with the
    ``finish_reason``, and with ``include_usage`` a last chunk with no choices and the usage
    (every earlier chunk then has ``usage: null``, as OpenAI sends it). Log-probs ride on the
    content delta (on the finishing one when there is no content). Concatenating the deltas, as
    the ``openai`` package's ``ChatCompletionStreamState`` does, gives back the completion's message.
    """
    choice = completion.choices[0]
    message = choice.message
    head = {"id": completion.id, "object": "chat.completion.chunk", "created": completion.created,
            "model": completion.model}
    if include_usage:
        head["usage"] = None
    logprobs = choice.logprobs.model_dump(mode="json", exclude_unset=True) if choice.logprobs is not None else None

    def chunk(delta: dict[str, Any], finish: str | None = None, lps: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}]}

    content = message.content
    chunks = [chunk({"role": "assistant", "content": "" if content is not None else None, "refusal": None})]
    if content:
        chunks.append(chunk({"content": content}, lps=logprobs))
        logprobs = None
    for k, call in enumerate(message.tool_calls or ()):
        chunks.append(chunk({"tool_calls": [{"index": k, "id": call.id, "type": "function",
                                             "function": {"name": call.function.name, "arguments": ""}}]}))
        if call.function.arguments:
            chunks.append(chunk({"tool_calls": [{"index": k, "function": {"arguments": call.function.arguments}}]}))
    chunks.append(chunk({}, choice.finish_reason, logprobs))
    if include_usage:
        usage = completion.usage.model_dump(mode="json", exclude_unset=True) if completion.usage else None
        chunks.append({**head, "choices": [], "usage": usage})
    validate = _chunk_type().model_validate
    return [validate(c) for c in chunks]


SSE_DONE = b"data: [DONE]\n\n"


def sse_events(chunks: Sequence[Any]) -> list[bytes]:
    """Server-sent events of `completion_chunks`: ``data: <chunk JSON>`` each, then ``data: [DONE]``."""
    return [b"data: " + c.model_dump_json(exclude_unset=True).encode() + b"\n\n" for c in chunks] + [SSE_DONE]
