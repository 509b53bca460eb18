"""Agent runners for proxy mode, by name or import path, bound to a manager's config.

A runner factory is ``factory(client, spec, config, **runner_kwargs) -> AgentRunner``: ``client``
is the episode's OpenAI-compatible client, ``spec`` its `EpisodeSpec`, ``config`` the
`ManagerConfig` whose sampling settings the runner should use. `bind_runner` turns one and its
kwargs into a `RunnerBinder`, ``config -> RunnerFactory``: `ProxyEnvManager(runner_for=...)`
binds it to its config, giving the ``(client, spec) -> AgentRunner`` callable (a `RunnerFactory`)
it calls per episode. `runner_binder` is the `RunnerBinder` of the runner a `ProxyConfig` names.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

from arl.agents.runner import AgentRunner
from arl.config import ManagerConfig, ProxyConfig
from arl.rollout.base import EpisodeSpec

RunnerFactory = Callable[[Any, EpisodeSpec], AgentRunner]  # (client, spec) -> the episode's runner
RunnerBinder = Callable[[ManagerConfig], RunnerFactory]  # config -> the RunnerFactory bound to it


def gym_runner(client: Any, spec: EpisodeSpec, config: ManagerConfig, *, runner_cls: Any = None,
               **kwargs: Any) -> AgentRunner:
    """arl's `GymRunner` (or ``runner_cls``) playing ``spec.env_id`` with the manager's sampling
    settings, prompt style and history window; ``kwargs`` go to the runner (e.g.
    ``conversation="step"`` for the step manager's self-contained prompts)."""
    from arl.agents.gym_runner import GymRunner, ToolCallRunner

    runner_cls = runner_cls or GymRunner
    if runner_cls is not ToolCallRunner:
        kwargs = {"prompt_style": config.prompt_style, "history_len": config.history_len,
                  "system_prompt": config.system_prompt, **kwargs}
    return runner_cls(
        client, spec.env_id, max_tokens=config.max_tokens, temperature=config.temperature,
        top_p=config.top_p, max_turns=config.max_turns, format_penalty=config.format_penalty,
        extra_body={"top_k": config.top_k} if config.top_k else None, env_kwargs=config.env_kwargs, **kwargs,
    )


def tool_runner(client: Any, spec: EpisodeSpec, config: ManagerConfig, **kwargs: Any) -> AgentRunner:
    """arl's `ToolCallRunner` (OpenAI function calling) on ``spec.env_id``."""
    from arl.agents.gym_runner import ToolCallRunner

    return gym_runner(client, spec, config, runner_cls=ToolCallRunner, **kwargs)


def push_runner(client: Any, spec: EpisodeSpec, config: ManagerConfig, *, command: list[str],
                timeout_s: float = 300.0, **kwargs: Any) -> AgentRunner:
    """`PushModeRunner`: ``command`` runs as the episode's agent in its own OS process
    (``{python}`` in it stands for this interpreter, so a config need not know the venv). The
    program learns the env id and sampling settings from ``ARL_ENV_ID``, ``ARL_MAX_TOKENS``,
    ``ARL_TEMPERATURE``, ``ARL_TOP_P``, ``ARL_MAX_TURNS`` (``arl.agents.examples.gym_agent`` reads them)."""
    from arl.agents.process import PushModeRunner

    command, env_extra = _agent_process(command, spec, config, kwargs.pop("env_extra", None))
    return PushModeRunner(client, command, timeout_s=timeout_s, env_extra=env_extra, **kwargs)


def pull_runner(client: Any, spec: EpisodeSpec, config: ManagerConfig, *, command: list[str],
                timeout_s: float = 300.0, **kwargs: Any) -> AgentRunner:
    """`PullModeRunner`: ``command`` runs as the episode's agent in a sandbox without network, its
    model calls answered over its pipes by the episode's handler (``client`` must be the
    in-process one: ``transport: inprocess``). Same ``{python}`` and ``ARL_*`` settings as push."""
    from arl.agents.pull import PullModeRunner
    from arl.intercept.exchange import responder

    check_pull_env(spec.env_id, config.env_kwargs)
    command, env_extra = _agent_process(command, spec, config, kwargs.pop("env_extra", None))
    return PullModeRunner(responder(client), command, timeout_s=timeout_s, env_extra=env_extra, **kwargs)


def check_pull_env(env_id: str, env_kwargs: Any = None) -> None:
    """Refuse (ValueError) an env whose reward pull mode cannot keep from the model: arl/BugFix-v0
    and its subclasses (`arl.envs.bugfix.env.PULL_MODE_REFUSAL` says why), unless its
    ``env_kwargs`` say ``allow_unhidden_tests: true`` (mechanics tests only). Called when the
    manager is built and for every pull-mode episode, before any agent starts."""
    import gymnasium as gym

    from arl.envs.bugfix.env import PULL_MODE_REFUSAL, BugFixEnv

    if dict(env_kwargs or {}).get("allow_unhidden_tests"):
        return
    try:
        entry = gym.spec(env_id).entry_point
        if isinstance(entry, str):
            module, _, name = entry.partition(":")
            entry = getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 -- an id gymnasium cannot resolve is the agent's own business
        return
    if isinstance(entry, type) and issubclass(entry, BugFixEnv):
        raise ValueError(f"rollout.proxy.runner=pull with env {env_id!r}: {PULL_MODE_REFUSAL}")


def _agent_process(command: list[str], spec: EpisodeSpec, config: ManagerConfig,
                   env_extra: Any) -> tuple[list[str], dict[str, str]]:
    """An agent program's command line (``{python}`` = this interpreter) and the ``ARL_*``
    variables that give it the episode's env id, the env's keyword arguments (``ARL_ENV_KWARGS``,
    JSON) and the config's sampling settings."""
    command = [sys.executable if part == "{python}" else str(part) for part in command]
    env = {
        "ARL_ENV_ID": spec.env_id, "ARL_ENV_KWARGS": json.dumps(dict(config.env_kwargs)),
        "ARL_MAX_TOKENS": str(config.max_tokens),
        "ARL_TEMPERATURE": repr(config.temperature), "ARL_TOP_P": repr(config.top_p),
        **({"ARL_MAX_TURNS": str(config.max_turns)} if config.max_turns is not None else {}),
        **{str(k): str(val) for k, val in dict(env_extra or {}).items()},
    }
    return command, env


RUNNERS: dict[str, Callable[..., AgentRunner]] = {
    "gym": gym_runner, "tool": tool_runner, "push": push_runner, "pull": pull_runner,
}


def resolve_runner(name: str) -> Callable[..., AgentRunner]:
    """A runner factory by short name (`RUNNERS`) or ``"package.module:attribute"``."""
    if name in RUNNERS:
        return RUNNERS[name]
    module_name, sep, attribute = name.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"rollout.proxy.runner={name!r}: use one of {', '.join(RUNNERS)} or 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"rollout.proxy.runner={name!r}: cannot import {module_name!r} ({exc})") from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"rollout.proxy.runner={name!r}: {module_name!r} has no {attribute!r}") from None
    if not callable(target):
        raise ValueError(f"rollout.proxy.runner={name!r} is not callable")
    return target


def bind_runner(make: Callable[..., AgentRunner], **kwargs: Any) -> RunnerBinder:
    """``make(client, spec, config, **kwargs)`` as ``config -> (client, spec) -> runner``, what
    `ProxyEnvManager(runner_for=...)` takes: the manager binds it to its own config, and re-binds it
    to each config it is derived with (the validation manager's temperature).

        ProxyEnvManager(engine, config, runner_for=bind_runner(my_factory, window=4))
    """

    def bind(config: ManagerConfig) -> RunnerFactory:
        return functools.partial(_call_runner, make, config, kwargs)

    return bind


def runner_binder(proxy: ProxyConfig) -> RunnerBinder:
    """`bind_runner` of the runner a `ProxyConfig` names, with its ``runner_kwargs``: not a
    runner factory, the `RunnerBinder` that makes one per `ManagerConfig`."""
    make = resolve_runner(proxy.runner)
    kwargs = dict(proxy.runner_kwargs)
    if make in (push_runner, pull_runner) and not kwargs.get("command"):
        raise ValueError(f"rollout.proxy.runner={proxy.runner} needs rollout.proxy.runner_kwargs.command "
                         "(the agent program)")
    if make is pull_runner and proxy.transport != "inprocess":
        raise ValueError("rollout.proxy.runner=pull answers the agent's pipes through the episode's handler: "
                         "set rollout.proxy.transport=inprocess")
    return bind_runner(make, **kwargs)


def _call_runner(make: Callable[..., AgentRunner], config: ManagerConfig, kwargs: dict[str, Any],
                 client: Any, spec: EpisodeSpec) -> AgentRunner:
    return make(client, spec, config, **kwargs)


__all__ = ["RUNNERS", "RunnerBinder", "RunnerFactory", "bind_runner", "check_pull_env", "gym_runner", "pull_runner",
           "push_runner", "resolve_runner", "runner_binder", "tool_runner"]
