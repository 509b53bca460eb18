"""The known fix of a `arl.envs.realbugs.tasks.RealBug` as tool calls (`arl eval --oracle`).

Three turns, as BugFix's solver (`arl.envs.bugfix.solver`): view the lines around the bug,
``str_replace`` the buggy line with the original one, submit.
"""

from __future__ import annotations

from typing import Any

from arl.envs.realbugs.tasks import RealBug


def realbug_calls(bug: RealBug) -> list[tuple[str, dict[str, Any]]]:
    """(tool name, arguments) of each turn of the known fix.

    >>> [name for name, _ in realbug_calls(RealBug("p", "m.py", 3, "a < b", "a <= b", "comparison"))]
    ['editor', 'editor', 'submit']
    """
    return [
        ("editor", {"command": "view", "path": bug.path, "view_range": [max(1, bug.line - 5), bug.line + 5]}),
        ("editor", {"command": "str_replace", "path": bug.path, "old_str": bug.buggy, "new_str": bug.original}),
        ("submit", {}),
    ]


__all__ = ["realbug_calls"]
