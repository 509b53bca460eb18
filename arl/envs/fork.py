"""Forking an env mid-episode: an independent copy of the whole wrapper stack in its current state.

`arl.rollout.fork` samples K actions in one state and plays each in its own copy of the env, so
the copy must continue exactly as the original would under the same actions (random generators
included: a slippery FrozenLake draws its slips from ``np_random``, which is copied with it) and
must share nothing mutable with it (the original never sees a branch's moves).

How a copy is made, per game (the unwrapped env):

- default: ``copy.deepcopy`` of the wrapper stack (TextEnv, TimeLimit, ..., the game). arl's games
  are plain Python and numpy state, so this is all they need.
- ``game.fork()``: a game that holds something deepcopy cannot copy (a process, a socket, a lock)
  but can rebuild its state provides it, returning an independent game in the same state; the
  wrappers around it are still deep-copied, around that copy.
- ``game.forkable = False``: a game that cannot be copied at all says so (a sandboxed tool env:
  its files live in another process).

Anything that cannot be copied raises `NotForkableError`, a TypeError naming the game and what to
do; `arl.rollout.fork.check_forkable` raises it when the manager is built, before any episode.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["NotForkableError", "fork_env"]


class NotForkableError(TypeError):
    """The env cannot be copied mid-episode, so its states cannot be forked (``rollout.manager.fork``)."""


def fork_env(env: Any) -> Any:
    """An independent copy of ``env`` (a gymnasium env or wrapper stack) in its current state.

    >>> from arl.envs.text import TextEnv
    >>> env = TextEnv("arl/FrozenLake-v0"); _ = env.reset(seed=1)
    >>> twin = fork_env(env)
    >>> twin.step("<answer>Up</answer>")[1:3] == env.step("<answer>Up</answer>")[1:3]
    True
    >>> twin.unwrapped is env.unwrapped
    False
    """
    game = getattr(env, "unwrapped", env)
    name = type(game).__name__
    if getattr(game, "forkable", True) is False:
        raise NotForkableError(f"{name} declares forkable = False: its states cannot be forked; "
                               "play it without rollout.manager.fork")
    memo: dict[int, Any] = {}
    own_fork = getattr(game, "fork", None)
    if callable(own_fork):
        # The game copies itself; deepcopy of the wrappers then finds that copy in the memo and
        # wraps it instead of copying the game again.
        memo[id(game)] = own_fork()
    try:
        return copy.deepcopy(env, memo)
    except Exception as exc:  # deepcopy raises TypeError, PicklingError, RecursionError, ...
        raise NotForkableError(
            f"{name} cannot be copied with copy.deepcopy ({type(exc).__name__}: {exc}); give the game a "
            "fork() method that returns an independent copy in the same state, set forkable = False, "
            "or play without rollout.manager.fork"
        ) from exc
