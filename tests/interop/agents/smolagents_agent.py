"""smolagents as it ships: ``ToolCallingAgent`` and ``CodeAgent`` over ``OpenAIModel`` (chat
completions, the agents' default stop strings), ``agent.run(task)`` or its streaming entry point
``agent.run(task, stream=True)`` with ``stream_outputs=True`` (the model's reply streamed too).

smolagents is synchronous: in push mode it runs as it is; in process the test runs `play_sync`
in a worker thread with arl's sync httpx transport as the client's ``http_client``.

``ToolCallingAgent`` sends ``tool_choice: "required"`` with every call: arl enforces it by
constrained decoding (a ``<tool_call>`` block in the form the chat templates render, arguments
matching the tool's schema), so its script is in that form; the scripted engine checks it."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ANSWER, Calls, main, verdict  # noqa: E402

ENTRIES = ("tool_calling", "tool_calling_stream", "code", "code_stream")
# the form tool_choice "required" forces (arl.intercept.toolcalls.tool_call_tag)
TOOL_SCRIPT = [
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "' + ANSWER + '"}}\n</tool_call>',
]
# CodeAgent: code blocks between its default tags; the stop string "</code>" ends each reply
CODE_SCRIPT = [
    "Thought: I add the numbers.\n<code>\nresult = add(2, 3)\nprint(result)\n</code>",
    'Thought: I have the sum.\n<code>\nfinal_answer(f"The answer is {result}.")\n</code>',
]
SCRIPTS = {entry: CODE_SCRIPT if entry.startswith("code") else TOOL_SCRIPT for entry in ENTRIES}


def play_sync(entry: str, http_client: Any = None, base_url: str | None = None) -> dict[str, Any]:
    from smolagents import CodeAgent, OpenAIModel, ToolCallingAgent, tool

    calls = Calls()

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return calls.add(a, b)

    kwargs: dict[str, Any] = {}
    if http_client is not None:
        kwargs = {"api_base": base_url, "api_key": "arl", "client_kwargs": {"http_client": http_client}}
    model = OpenAIModel(model_id=os.environ.get("ARL_MODEL", "arl"), **kwargs)
    stream = entry.endswith("_stream")
    cls = CodeAgent if entry.startswith("code") else ToolCallingAgent
    agent = cls(tools=[add], model=model, max_steps=4, stream_outputs=stream)
    if stream:
        steps = list(agent.run("What is 2 + 3? Use the add tool.", stream=True))
        output = getattr(steps[-1], "output", None) if steps else None
        return verdict(calls, output, stream_steps=float(len(steps)))
    return verdict(calls, agent.run("What is 2 + 3? Use the add tool."))


async def play(entry: str) -> dict[str, Any]:
    return play_sync(entry)


if __name__ == "__main__":
    main(play, ENTRIES)
