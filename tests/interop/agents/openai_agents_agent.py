"""openai-agents as it ships: ``Agent`` with a ``function_tool``, ``Runner.run`` (the Responses
API, the SDK's default) or ``Runner.run_streamed`` (its streaming entry point)."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ANSWER, CALL_ADD, INSTRUCTIONS, TASK, Calls, main, verdict  # noqa: E402

ENTRIES = ("run", "run_streamed")
SCRIPT = [CALL_ADD, ANSWER]


async def play(entry: str, http_client: Any = None, base_url: str | None = None) -> dict[str, Any]:
    """One episode. Push mode: defaults only (the SDK's OpenAI provider reads OPENAI_BASE_URL /
    OPENAI_API_KEY; tracing is off through OPENAI_AGENTS_DISABLE_TRACING, which push mode sets).
    In process: the SDK's own ``OpenAIProvider(openai_client=...)`` in the run config, around an
    ``AsyncOpenAI`` whose ``http_client`` is arl's httpx transport."""
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider

    calls = Calls()

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return calls.add(a, b)

    # no model named: the SDK's default model and its default settings (for a GPT-5 default, the
    # reasoning and verbosity fields: no-ops arl accepts and counts)
    agent = Agent(name="calculator", instructions=INSTRUCTIONS, tools=[add])
    config = None
    if http_client is not None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key="arl", http_client=http_client)
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
    events = 0
    if entry == "run":
        result = await Runner.run(agent, TASK, run_config=config, max_turns=4)
    else:
        result = Runner.run_streamed(agent, TASK, run_config=config, max_turns=4)
        async for _event in result.stream_events():
            events += 1
    return verdict(calls, result.final_output, stream_events=float(events))


if __name__ == "__main__":
    main(play, ENTRIES)
