"""Oracle play: each task's gold solution in place of a model (`arl eval --oracle`).

What a panel scores when every reply is right: an upper bound for the model's numbers on the same
panel, and a check that every task of a task set can be solved under its step limit.

- The games (an arl `Game` with a ``solution()``: FrozenLake's shortest path around the holes,
  Sokoban's shortest solution by breadth-first search) are played by `OracleEnvManager`, the step
  manager whose reply at every step is ``<answer>A</answer>`` for the first action of the game's
  solution from the state it is in, asked again after each step (on slippery ice a move may slip:
  the next step plans from where it landed; success is then not certain).
- BugFix (``arl/BugFix-v0``) is played by the configured tool-calling agent (proxy mode) against
  `OracleClient`, whose k-th reply is the k-th tool call of the task's known fix
  (`arl.envs.bugfix.solver.solution_calls`: view the module, replace the buggy line, submit);
  ``arl/RealBugFix-v0`` the same way (`arl.envs.realbugs.solver.realbug_calls`).

Replies are recorded as a model server's are (``turn.info["reply"]``), so `rescore` and `arl view`
read an oracle's results directory like any other.
"""

from __future__ import annotations

import json
import time
from typing import Any

from arl.config import RolloutConfig
from arl.engine.base import Generation
from arl.rollout.base import EnvError, EnvManager, EpisodeSpec
from arl.rollout.records import Sample, Trajectory, Turn
from arl.rollout.remote import RemoteProxyEnvManager
from arl.rollout.runners import make_runner_factory
from arl.rollout.step import StepEnvManager

BUGFIX_ENV = "arl/BugFix-v0"
REALBUGS_ENV = "arl/RealBugFix-v0"  # played like BugFix: the known fix is the mutated line put back


def gold_reply(env: Any) -> str:
    """The reply that takes the gold solution's next step in ``env``'s current state."""
    plan = env.unwrapped.solution()
    if not plan:  # solved already, or no way on (a hole, a box in a corner): the game ends it either way
        raise EnvError(f"the game has no solution from this state ({'solved' if plan == [] else 'none found'})")
    return f"<answer>{plan[0]}</answer>"


class OracleEnvManager(StepEnvManager):
    """`StepEnvManager` whose replies are `gold_reply`; no engine, no prompt, no samples."""

    mode = "oracle"

    def step_prompt(self, env: Any, obs: str, t: int, history: list[tuple[str, str, float]], limit: int) -> Any:
        return []  # the oracle reads the game, not a prompt

    def fits(self, prompt_len: int) -> bool:
        return True

    def remember(self, history: list[tuple[str, str, float]], obs: str, turn: Turn) -> None:
        return None

    async def act(self, spec: EpisodeSpec, traj: Trajectory, env: Any, prompt_ids: Any,
                  observation: str, rendered: Any = None) -> tuple[Turn, str, bool, bool]:
        text = self.env_call(traj, gold_reply, env)
        turn, obs, terminated, truncated = await self.take(traj, env, [], observation, Generation([], [], "stop", 0),
                                                     text=text)
        turn.info["reply"] = text
        turn.sampled_with = None
        self.record(traj, turn)
        return turn, obs, terminated, truncated

    def _build_samples(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        return []

    def derive(self, config: Any = None, engine: Any = None) -> EnvManager:
        return OracleEnvManager(self.engine if engine is None else engine, config or self.config)


class OracleClient:
    """An OpenAI-compatible client whose k-th ``chat.completions.create`` reply is the k-th tool call
    of BugFix task ``seed``'s known fix (then ``submit`` again)."""

    def __init__(self, seed: int, env_id: str = BUGFIX_ENV):
        from arl.envs.bugfix.solver import solution_calls

        if env_id == REALBUGS_ENV:
            from arl.envs.realbugs.env import task_for
            from arl.envs.realbugs.solver import realbug_calls

            self.calls = realbug_calls(task_for(int(seed)))
        else:
            from arl.envs.bugfix.tasks import generate_task

            self.calls = solution_calls(generate_task(int(seed)))
        self.made = 0
        self.chat = _Namespace(completions=_Namespace(create=self._create))
        self.base_url, self.api_key = "oracle://", "oracle"  # no server: push mode cannot use it

    async def _create(self, **kwargs: Any) -> Any:
        from openai.types.chat import ChatCompletion

        name, arguments = self.calls[min(self.made, len(self.calls) - 1)]
        self.made += 1
        call = {"id": f"call_{self.made}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}
        return ChatCompletion.model_validate({
            "id": f"oracle-{self.made}", "object": "chat.completion", "created": int(time.time()),
            "model": "oracle", "choices": [{"index": 0, "finish_reason": "tool_calls",
                                            "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})


class _Namespace:
    def __init__(self, **attrs: Any):
        self.__dict__.update(attrs)


class OracleProxyEnvManager(RemoteProxyEnvManager):
    """Proxy mode's agent with an `OracleClient` for the episode's task."""

    mode = "oracle"

    def client_for(self, spec: EpisodeSpec) -> Any:
        return OracleClient(spec.seed, spec.env_id)

    def derive(self, config: Any = None, engine: Any = None) -> EnvManager:
        return OracleProxyEnvManager(None, config or self.config, self.runner_factory)


def check_oracle(rollout: RolloutConfig) -> None:
    """Refuse (ValueError) a game without a gold solution, or BugFix outside a tool-calling proxy agent."""
    if rollout.env_id in (BUGFIX_ENV, REALBUGS_ENV):
        if rollout.mode != "proxy" or rollout.proxy.runner in ("gym", "push"):
            raise ValueError(f"--oracle plays {rollout.env_id} through a tool-calling agent in process: rollout.mode "
                             "proxy with a tool runner (e.g. the tiny_bugfix_proxy config), not "
                             f"mode={rollout.mode!r} runner={rollout.proxy.runner!r}")
        return
    from arl.envs.text import TextEnv

    game = TextEnv(rollout.env_id, **rollout.manager.env_kwargs).unwrapped
    if not callable(getattr(game, "solution", None)):
        raise ValueError(f"{rollout.env_id} has no gold solution (a game's solution() method), so --oracle cannot "
                         f"play it; the games with one: arl/FrozenLake-v0, arl/Sokoban-v0 and their variants, "
                         f"and {BUGFIX_ENV}, {REALBUGS_ENV}")


def make_oracle_manager(rollout: RolloutConfig) -> EnvManager:
    check_oracle(rollout)
    if rollout.env_id in (BUGFIX_ENV, REALBUGS_ENV):
        return OracleProxyEnvManager(None, rollout.manager, make_runner_factory(rollout.proxy))
    return OracleEnvManager(None, rollout.manager)


__all__ = ["BUGFIX_ENV", "REALBUGS_ENV", "OracleClient", "OracleEnvManager", "OracleProxyEnvManager", "check_oracle", "gold_reply",
           "make_oracle_manager"]
