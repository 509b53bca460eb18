"""LiteLLM as it ships: ``litellm.acompletion`` with an ``openai/`` model (its OpenAI-compatible
provider, chat completions) in the usual tool loop, whole replies or ``stream=True`` (its streaming
entry point, the chunks joined by ``litellm.stream_chunk_builder``).

``import litellm`` would download a model price map (three tries, each waiting out its timeout
without network): push mode sets ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (its bundled copy), as
`arl.agents.process.NETWORK_OFF` says; the tests set it in their own process too."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ANSWER, CALL_ADD, INSTRUCTIONS, TASK, Calls, main, verdict  # noqa: E402

ENTRIES = ("acompletion", "acompletion_stream", "aresponses", "aresponses_stream")
SCRIPT = [CALL_ADD, ANSWER]
ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


async def play_responses(entry: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """LiteLLM's Responses API (``litellm.aresponses``, the OpenAI provider's ``/responses``): the
    tool's result goes back as a ``function_call_output`` on ``previous_response_id``, with the
    ``instructions`` again (the Responses API does not carry them over).

    ``stream=True``: for a model missing from its model map (an arl model is) LiteLLM fakes the
    stream, one plain request replayed as events (`litellm.utils.supports_native_streaming`)."""
    import litellm

    calls = Calls()
    model = "openai/" + os.environ.get("ARL_MODEL", "arl")
    tool = {"type": "function", **ADD_TOOL["function"]}
    stream = entry.endswith("_stream")
    request: dict[str, Any] = {"input": TASK}
    text = None
    for _ in range(4):  # bounded: the script answers on the second call
        if stream:
            response = None
            async for event in await litellm.aresponses(model=model, tools=[tool], instructions=INSTRUCTIONS,
                                                        stream=True, **request, **kwargs):
                if getattr(event, "type", "") == "response.completed":
                    response = event.response
        else:
            response = await litellm.aresponses(model=model, tools=[tool], instructions=INSTRUCTIONS, **request,
                                                **kwargs)
        if response is None:
            break
        fcalls = [item for item in response.output if getattr(item, "type", "") == "function_call"]
        if not fcalls:
            text = "".join(part.text for item in response.output if getattr(item, "type", "") == "message"
                           for part in item.content if getattr(part, "type", "") == "output_text")
            break
        outputs = [{"type": "function_call_output", "call_id": call.call_id,
                    "output": str(calls.add(**json.loads(call.arguments)))} for call in fcalls]
        request = {"input": outputs, "previous_response_id": response.id}
    return verdict(calls, text)


async def play(entry: str, http_client: Any = None, base_url: str | None = None,
               api_key: str | None = None) -> dict[str, Any]:
    """One episode. Push mode: defaults only (LiteLLM's OpenAI provider reads OPENAI_BASE_URL /
    OPENAI_API_KEY). In process, chat completions: LiteLLM's own ``client=`` parameter, an
    ``AsyncOpenAI`` whose ``http_client`` is arl's httpx transport; the Responses API takes no
    such client (only LiteLLM's own HTTP handler), so there ``api_base`` / ``api_key``: the
    address and episode key of arl's HTTP proxy."""
    import litellm

    calls = Calls()
    kwargs: dict[str, Any] = {}
    if api_key is not None:
        kwargs = {"api_base": base_url, "api_key": api_key}
    elif http_client is not None:
        from openai import AsyncOpenAI

        kwargs = {"client": AsyncOpenAI(base_url=base_url, api_key="arl", http_client=http_client)}
    if entry.startswith("aresponses"):
        return await play_responses(entry, kwargs)
    model = "openai/" + os.environ.get("ARL_MODEL", "arl")
    messages: list[Any] = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": TASK}]
    stream = entry.endswith("_stream")
    message = None
    for _ in range(4):  # bounded: the script answers on the second call
        if stream:
            chunks = [chunk async for chunk in await litellm.acompletion(
                model=model, messages=messages, tools=[ADD_TOOL], stream=True, **kwargs)]
            response = litellm.stream_chunk_builder(chunks, messages=messages)
        else:
            response = await litellm.acompletion(model=model, messages=messages, tools=[ADD_TOOL], **kwargs)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(calls.add(**args))})
    return verdict(calls, message.content if message is not None else None)


if __name__ == "__main__":
    main(play, ENTRIES)
