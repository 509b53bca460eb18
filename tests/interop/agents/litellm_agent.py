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

ENTRIES = ("acompletion", "acompletion_stream")
SCRIPT = [CALL_ADD, ANSWER]
ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


async def play(entry: str, http_client: Any = None, base_url: str | None = None) -> dict[str, Any]:
    """One episode. Push mode: defaults only (LiteLLM's OpenAI provider reads OPENAI_BASE_URL /
    OPENAI_API_KEY). In process: LiteLLM's own ``client=`` parameter, an ``AsyncOpenAI`` whose
    ``http_client`` is arl's httpx transport."""
    import litellm

    calls = Calls()
    kwargs: dict[str, Any] = {}
    if http_client is not None:
        from openai import AsyncOpenAI

        kwargs = {"client": AsyncOpenAI(base_url=base_url, api_key="arl", http_client=http_client)}
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
