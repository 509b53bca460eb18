"""The scripted solver: the known fix of a task as tool calls (the tasks' solvability test).

Three turns: view the module, ``str_replace`` the buggy line with the fixed one, submit.
`solution_calls` gives them as OpenAI tool calls (``(name, arguments)``); `solution_text` as the
``<tool_call>{json}</tool_call>`` text a model writes, for the scripted engine.
"""

from __future__ import annotations

import json
from typing import Any

from arl.envs.bugfix.tasks import BugFixTask


def solution_calls(task: BugFixTask) -> list[tuple[str, dict[str, Any]]]:
    """(tool name, arguments) of each turn of the known solution."""
    buggy, fixed = task.fix
    return [
        ("editor", {"command": "view", "path": task.filename}),
        ("editor", {"command": "str_replace", "path": task.filename, "old_str": buggy, "new_str": fixed}),
        ("submit", {}),
    ]


def assistant_message(name: str, arguments: dict[str, Any], call_id: str = "call_0") -> dict[str, Any]:
    """One tool call as an OpenAI assistant message (what `BugFixEnv.step` takes)."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def solution_text(task: BugFixTask, turn: int) -> str:
    """What a model writes at ``turn`` (0-based) of the known solution; submit after the end."""
    calls = solution_calls(task)
    name, arguments = calls[min(turn, len(calls) - 1)]
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


__all__ = ["assistant_message", "solution_calls", "solution_text"]
