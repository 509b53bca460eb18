"""What the framework agents share: the task, the tool, the scripted model's replies, and
the push-mode result file. Imports nothing of arl (the agents run in .venv-interop, where arl is
not installed) and nothing of the frameworks.

The task is "2 + 3": the model (arl's scripted engine, `SCRIPTS`) first calls the ``add`` tool,
then answers with ``ANSWER``. An agent passes when its framework ran the tool exactly once with
(2, 3) and returned the answer; the test then checks the samples on arl's side.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TASK = "What is 2 + 3? Use the add tool."
INSTRUCTIONS = "You are a calculator. Call the add tool, then state the result."
ANSWER = "The answer is 5."
CALL_ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


class Calls:
    """The tool's calls, as the framework made them."""

    def __init__(self) -> None:
        self.args: list[tuple[int, int]] = []

    def add(self, a: int, b: int) -> int:
        self.args.append((a, b))
        return a + b


def verdict(calls: Calls, output: Any, *, answer: str = ANSWER, **metrics: float) -> dict[str, Any]:
    """The episode result: score 1 when the tool ran once with (2, 3) and the output is the answer."""
    text = str(output).strip()
    ok = calls.args == [(2, 3)] and text == answer
    return {"score": float(ok), "success": ok, "exit_reason": "terminated",
            "metrics": {"tool_calls": float(len(calls.args)), "answer_ok": float(text == answer), **metrics},
            "error": None if ok else f"tool calls {calls.args}, output {text[:500]!r}"}


def main(play: Any, entries: tuple[str, ...]) -> None:
    """Push mode: ``python <agent>.py <entry>``; the framework reads OPENAI_BASE_URL and
    OPENAI_API_KEY itself; the result goes to ARL_RESULT_PATH."""
    import asyncio

    entry = sys.argv[1] if len(sys.argv) > 1 else entries[0]
    if entry not in entries:
        raise SystemExit(f"entry must be one of {entries}, got {entry!r}")
    result = asyncio.run(play(entry))
    with open(os.environ["ARL_RESULT_PATH"], "w") as f:
        json.dump(result, f)
