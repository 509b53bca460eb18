"""pydantic-ai as it ships: ``Agent("openai:<model>")`` (the Responses API, what the ``openai:``
prefix means) with a plain tool, ``agent.run`` or ``agent.run_stream`` (its streaming entry point)."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ANSWER, CALL_ADD, INSTRUCTIONS, TASK, Calls, main, verdict  # noqa: E402

ENTRIES = ("run", "run_stream")
SCRIPT = [CALL_ADD, ANSWER]


async def play(entry: str, http_client: Any = None, base_url: str | None = None) -> dict[str, Any]:
    """One episode. Push mode: ``Agent("openai:...")``, whose provider reads OPENAI_BASE_URL /
    OPENAI_API_KEY. In process: the model ``"openai:"`` names (``OpenAIResponsesModel``) with the
    framework's own ``OpenAIProvider(base_url=..., http_client=...)`` (arl's httpx transport)."""
    from pydantic_ai import Agent

    name = os.environ.get("ARL_MODEL", "arl")
    if http_client is None:
        model: Any = f"openai:{name}"
    else:
        from pydantic_ai.models.openai import OpenAIResponsesModel
        from pydantic_ai.providers.openai import OpenAIProvider

        provider = OpenAIProvider(base_url=base_url, api_key="arl", http_client=http_client)
        model = OpenAIResponsesModel(name, provider=provider)
    calls = Calls()
    agent = Agent(model, instructions=INSTRUCTIONS)

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return calls.add(a, b)

    if entry == "run":
        output = (await agent.run(TASK)).output
    else:
        async with agent.run_stream(TASK) as result:
            pieces = [text async for text in result.stream_text()]
            output = await result.get_output()
        return verdict(calls, output, stream_pieces=float(len(pieces)))
    return verdict(calls, output)


if __name__ == "__main__":
    main(play, ENTRIES)
