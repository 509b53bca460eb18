"""arl's game environments and their LLM-facing wrappers (docs/architecture.md §6).

Importing this package is cheap (gymnasium + numpy only). `register_envs()` registers the
``arl/...`` ids with gymnasium; it is idempotent, and `arl/__init__.py` calls it.

Step limits (gymnasium TimeLimit) and why:
- ``arl/Sokoban-v0``, ``arl/SokobanAltVocab-v0``: 6x6, 1 box, 10 steps (ROLL / RAGEN anchors).
- ``arl/Sokoban-8x8-v0``: 8x8, 2 boxes, 20 steps; ``arl/Sokoban-10x10-v0``: 10x10, 2 boxes,
  30 steps. Level generation bounds its backward search by the same number, so every level is
  solvable inside the limit.
- ``arl/FrozenLake-v0`` (non-slippery) and ``arl/FrozenLakeSlippery-v0``: 4x4, p = 0.8, 10 steps.

Tool envs (not games: `TextEnv`/`ToolEnv` do not wrap them; `TOOL_ENV_SPECS`):
- ``arl/BugFix-v0``: a generated bug-fix task per seed in a sandbox (`arl.envs.bugfix`), 20 turns,
  counted by the env itself (its last turn runs the hidden tests).
- ``arl/RealBugFix-v0``: a bug put into a real PyPI package, judged by the package's own tests
  (`arl.envs.realbugs`; built once by ``python -m arl.envs.realbugs.build``), 30 turns.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from arl.envs.frozen_lake import FrozenLakeEnv
from arl.envs.game import Game, anchor_key, check_game, game_state_key, register_game, state_hash
from arl.envs.sokoban import SokobanEnv
from arl.envs.text import TextEnv, parse_answer
from arl.envs.tools import ToolEnv

__all__ = [
    "ENV_SPECS",
    "TOOL_ENV_SPECS",
    "FrozenLakeEnv",
    "Game",
    "SokobanEnv",
    "TextEnv",
    "ToolEnv",
    "anchor_key",
    "check_game",
    "game_state_key",
    "parse_answer",
    "register_envs",
    "register_game",
    "state_hash",
]

_SOKOBAN = "arl.envs.sokoban:SokobanEnv"
_FROZEN_LAKE = "arl.envs.frozen_lake:FrozenLakeEnv"

# id -> (entry point, max_episode_steps, constructor kwargs)
ENV_SPECS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "arl/Sokoban-v0": (_SOKOBAN, 10, {"dim_room": (6, 6), "num_boxes": 1}),
    "arl/Sokoban-8x8-v0": (_SOKOBAN, 20, {"dim_room": (8, 8), "num_boxes": 2}),
    "arl/Sokoban-10x10-v0": (_SOKOBAN, 30, {"dim_room": (10, 10), "num_boxes": 2}),
    "arl/SokobanAltVocab-v0": (_SOKOBAN, 10, {"dim_room": (6, 6), "num_boxes": 1, "vocabulary": "alt"}),
    "arl/FrozenLake-v0": (_FROZEN_LAKE, 10, {"size": 4, "p": 0.8, "is_slippery": False}),
    "arl/FrozenLakeSlippery-v0": (_FROZEN_LAKE, 10, {"size": 4, "p": 0.8, "is_slippery": True}),
}

# id -> (entry point, turns)
TOOL_ENV_SPECS: dict[str, tuple[str, int]] = {"arl/BugFix-v0": ("arl.envs.bugfix.env:BugFixEnv", 20),
                                               "arl/RealBugFix-v0": ("arl.envs.realbugs.env:RealBugFixEnv", 30)}


def register_envs() -> None:
    """Register every ``arl/`` id with gymnasium (safe to call any number of times)."""
    for env_id, (entry_point, max_steps, kwargs) in ENV_SPECS.items():
        if env_id in gym.registry:
            continue
        if entry_point == _SOKOBAN:
            # The generator must know the limit so its backward search never exceeds it.
            kwargs = {**kwargs, "max_steps": max_steps}
        register_game(env_id, entry_point, max_episode_steps=max_steps, **kwargs)
    for env_id, (entry_point, max_steps) in TOOL_ENV_SPECS.items():
        if env_id not in gym.registry:
            # They count their own turns (the last one is evaluated) and step returns reply
            # messages, like ToolEnv: no TimeLimit, no passive checker.
            gym.register(id=env_id, entry_point=entry_point, kwargs={"max_steps": max_steps},
                         disable_env_checker=True)
