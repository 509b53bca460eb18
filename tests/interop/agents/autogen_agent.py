"""autogen-agentchat as it ships: ``AssistantAgent`` with a tool over autogen-ext's
``OpenAIChatCompletionClient`` (chat completions), ``run`` or ``run_stream`` (its streaming entry
point, with ``model_client_stream=True`` so the model's reply streams too).

One thing it needs that its defaults do not give: ``model_info``. The client refuses a model name
that is not OpenAI's without it (before any request); the program passes the one docs/guide.md
gives for an arl model. With its defaults the agent does not reflect on a tool's result
(``reflect_on_tool_use`` off): one model call, and the run's answer is the tool's result.

Push mode only: autogen-core pins protobuf 5.29, arl's venv holds 7.x (setup.cfg's
``interop-push`` extra installs it in .venv-interop alone)."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import CALL_ADD, INSTRUCTIONS, TASK, Calls, main, verdict  # noqa: E402

ENTRIES = ("run", "run_stream")
SCRIPT = [CALL_ADD]
# docs/guide.md's model_info for an arl model
MODEL_INFO = {"vision": False, "function_calling": True, "json_output": False, "structured_output": False,
              "family": "unknown"}


async def play(entry: str) -> dict[str, Any]:
    """One episode, push mode: the client reads OPENAI_BASE_URL / OPENAI_API_KEY (the openai SDK
    under it does); only ``model`` and ``model_info`` are given."""
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.base import TaskResult
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    calls = Calls()

    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return calls.add(a, b)

    client = OpenAIChatCompletionClient(model=os.environ.get("ARL_MODEL", "arl"), model_info=MODEL_INFO)
    stream = entry == "run_stream"
    agent = AssistantAgent("calculator", model_client=client, tools=[add], system_message=INSTRUCTIONS,
                           model_client_stream=stream)
    events = 0
    result = None
    if stream:
        async for item in agent.run_stream(task=TASK):
            if isinstance(item, TaskResult):
                result = item
            else:
                events += 1
    else:
        result = await agent.run(task=TASK)
    await client.close()
    final = result.messages[-1].content if result is not None and result.messages else None
    return verdict(calls, final, answer="5", stream_events=float(events))


if __name__ == "__main__":
    main(play, ENTRIES)
