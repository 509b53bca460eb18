"""Agent runners for proxy mode, by name or import path, bound to a manager's config.

A runner factory is ``factory(client, spec, config, **runner_kwargs) -> AgentRunner``: ``client``
is the episode's OpenAI-compatible client, ``spec`` its `EpisodeSpec`, ``config`` the
`ManagerConfig` whose sampling settings the runner should use. `bind_runner` turns one and its
kwargs into a `RunnerBinder`, ``config -> RunnerFactory``: `ProxyEnvManager(runner_for=...)`
binds it to its config, giving the ``(client, spec) -> AgentRunner`` callable (a `RunnerFactory`)
it calls per episode. `runner_binder` is the `RunnerBinder` of the runner a `ProxyConfig` names.

``rollout.proxy.runner: "package.module:name"`` may also name an agent function, ``async def
agent(client, seed, **runner_kwargs) -> result`` (told apart from a factory by being async):
`agent_function_runner` makes it a factory of `arl.agents.runner.FunctionRunner`, which reads
its result with `arl.agents.runner.as_episode_result`. It gets ``env_id``, ``spec`` or
``config`` too when it has a parameter of that name (`AGENT_CONTEXT`). Either kind's signature
is checked when the binder is made (`runner_binder`: before anything is built), not per episode.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import sys
from collections.abc import Callable
from typing import Any

from arl.agents.runner import AgentFunction, AgentRunner, FunctionRunner
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
    from arl.envs.bugfix.env import PULL_MODE_REFUSAL, BugFixEnv

    if dict(env_kwargs or {}).get("allow_unhidden_tests"):
        return
    try:
        entry = env_spec(env_id).entry_point
        if isinstance(entry, str):
            module, _, name = entry.partition(":")
            entry = getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 -- an id gymnasium cannot resolve is the agent's own business
        return
    if isinstance(entry, type) and issubclass(entry, BugFixEnv):
        raise ValueError(f"rollout.proxy.runner=pull with env {env_id!r}: {PULL_MODE_REFUSAL}")


def env_spec(env_id: str) -> Any:
    """gymnasium's `EnvSpec` of ``env_id``: a registered id, or ``"package.module:Env-v0"``, which
    imports the module (where the env registers itself) first, as ``gymnasium.make`` does
    (``gymnasium.spec`` alone does not import). Raises what gymnasium raises for an unknown id
    (``gymnasium.error.Error`` subclasses), ModuleNotFoundError for a module that is not there."""
    import gymnasium as gym

    module, sep, name = env_id.rpartition(":")
    if sep and module:
        importlib.import_module(module)
    return gym.spec(name if sep else env_id)


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


def resolve_runner(name: str) -> Callable[..., Any]:
    """A runner factory by short name (`RUNNERS`) or ``"package.module:attribute"``: the attribute
    as it is, a factory or an agent function (`is_agent_function`; `runner_binder` wraps it)."""
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


# What an agent function may ask for besides (client, seed), by naming a parameter so: the episode's
# env id, its EpisodeSpec (env_id, seed, group_id, episode_id, tag), the manager's ManagerConfig.
AGENT_CONTEXT: tuple[str, ...] = ("env_id", "spec", "config")


def is_agent_function(target: Any) -> bool:
    """Is ``target`` an agent function (an ``async def``, or an object whose ``__call__`` is one)
    rather than a runner factory (a plain function or class that returns an `AgentRunner`)?"""
    if isinstance(target, type):
        return False
    call = type(target).__call__ if callable(target) and not inspect.isroutine(target) else None
    return inspect.iscoroutinefunction(target) or (call is not None and inspect.iscoroutinefunction(call))


def agent_function_runner(fn: AgentFunction) -> Callable[..., AgentRunner]:
    """The runner factory of the agent function ``fn``: ``make(client, spec, config,
    **runner_kwargs)`` returns a `FunctionRunner` that awaits ``fn(client, seed, **runner_kwargs)``,
    with ``env_id=``, ``spec=``, ``config=`` added for the `AGENT_CONTEXT` names ``fn`` has as
    parameters (a ``**kwargs`` catch-all asks for none of them)."""
    wanted = _context_names(fn)

    def make(client: Any, spec: EpisodeSpec, config: ManagerConfig, **runner_kwargs: Any) -> AgentRunner:
        context = {"env_id": spec.env_id, "spec": spec, "config": config}
        return FunctionRunner(client, fn, {**{k: context[k] for k in wanted}, **runner_kwargs})

    make.agent_function = fn  # type: ignore[attr-defined]  (what it wraps, for a reader)
    return make


def _context_names(fn: Any) -> list[str]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [name for name in AGENT_CONTEXT if name in params and params[name].kind in kinds]


def _check_call(name: str, target: Any, kwargs: dict[str, Any]) -> None:
    """ValueError unless ``target`` can be called as arl will call it: an agent function as
    ``agent(client, seed, [env_id=, spec=, config=,] **runner_kwargs)``, a factory as
    ``factory(client, spec, config, **runner_kwargs)``."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no signature to read (some builtins): its errors come per episode
        return
    if is_agent_function(target):
        wanted = _context_names(target)
        args, form = (None, 0), "agent(client, seed" + "".join(f", {k}=" for k in wanted)
        extra = {k: None for k in wanted}
    else:
        args, form, extra = (None, None, None), "factory(client, spec, config", {}
    try:
        signature.bind(*args, **extra, **kwargs)
    except TypeError as exc:
        given = "".join(f", {k}=" for k in kwargs)
        raise ValueError(f"rollout.proxy.runner={name!r} is called as {form}{given}) (runner_kwargs: "
                         f"{sorted(kwargs) or 'none'}), which {getattr(target, '__name__', 'it')}{signature} "
                         f"does not take: {exc}") from None


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
    runner factory, the `RunnerBinder` that makes one per `ManagerConfig`. An agent function is
    wrapped (`agent_function_runner`). ValueError, before any episode, for a runner that does not
    resolve, whose signature does not take the call arl makes (`_check_call`), or that lacks what
    it needs (push: a command and ``transport: http``; pull: a command and ``transport: inprocess``)."""
    make = resolve_runner(proxy.runner)
    kwargs = dict(proxy.runner_kwargs)
    if make in (push_runner, pull_runner) and not kwargs.get("command"):
        raise ValueError(f"rollout.proxy.runner={proxy.runner} needs rollout.proxy.runner_kwargs.command "
                         "(the agent program)")
    if make is push_runner and proxy.transport != "http":
        raise ValueError("rollout.proxy.runner=push runs the agent in another process: set rollout.proxy.transport=http")
    if make is pull_runner and proxy.transport != "inprocess":
        raise ValueError("rollout.proxy.runner=pull answers the agent's pipes through the episode's handler: "
                         "set rollout.proxy.transport=inprocess")
    _check_call(proxy.runner, make, kwargs)
    if is_agent_function(make):
        make = agent_function_runner(make)
    return bind_runner(make, **kwargs)


def _call_runner(make: Callable[..., AgentRunner], config: ManagerConfig, kwargs: dict[str, Any],
                 client: Any, spec: EpisodeSpec) -> AgentRunner:
    return make(client, spec, config, **kwargs)


__all__ = ["AGENT_CONTEXT", "RUNNERS", "RunnerBinder", "RunnerFactory", "agent_function_runner", "bind_runner",
           "check_pull_env", "env_spec", "gym_runner", "is_agent_function", "pull_runner", "push_runner",
           "resolve_runner", "runner_binder", "tool_runner"]
