"""BugFixRunner: arl's tool-calling runner on the sandbox bug-fix env (``arl/BugFix-v0``).

The turn loop is `ToolCallRunner`'s (tools sent with every request, the env's tool messages
appended to the history); the env is made with ``gymnasium.make`` (it is no game, so `ToolEnv`
does not wrap it) and its steps are awaited (`BugFixEnv.astep`: commands run as subprocesses
without blocking the event loop). The env closes its sandbox when the episode ends.

Proxy mode: ``rollout.proxy.runner: arl.agents.bugfix:bugfix_runner`` (see
``arl/configs/tiny_bugfix_proxy.yaml``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from arl.agents.gym_runner import ToolCallRunner
from arl.agents.runner import AgentRunner

SYSTEM_PROMPT = (
    "You are a careful software engineer. Work in the repository with the tools you are given, "
    "one tool call per turn, and submit when the bug is fixed."
)


class BugFixRunner(ToolCallRunner):
    """Plays ``arl/BugFix-v0`` (or any env with `BugFixEnv`'s tool interface) by tool calls."""

    def __init__(self, client: Any, env_id: str = "arl/BugFix-v0", **kwargs: Any) -> None:
        super().__init__(client, env_id, **kwargs)

    def make_env(self) -> Any:
        from arl.envs import register_envs

        register_envs()
        return gym.make(self.env_id, **self.env_kwargs).unwrapped

    def first_messages(self, env: Any, observation: str, limit: int) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{env.instructions}\n\n{observation}"},
        ]


def bugfix_runner(client: Any, spec: Any, config: Any, **kwargs: Any) -> AgentRunner:
    """The runner factory (`arl.rollout.runners.RunnerFactory`) of `BugFixRunner`: one on
    ``spec.env_id`` with the manager config's sampling settings (the same mapping as
    `arl.rollout.runners.gym_runner`; ``kwargs`` go to the runner)."""
    return BugFixRunner(
        client, spec.env_id, max_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p,
        max_turns=config.max_turns, extra_body={"top_k": config.top_k} if config.top_k else None,
        env_kwargs=config.env_kwargs, **kwargs,
    )


__all__ = ["SYSTEM_PROMPT", "BugFixRunner", "bugfix_runner"]
