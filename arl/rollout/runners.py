"""Runner factories: how proxy mode makes each episode's agent, from a name, an import path or code.

Three things, each with one name in arl:

- **agent code**, what plays an episode: an `AgentRunner` (a subclass such as `GymRunner`), or
  an *agent function* ``async def agent(client, seed, **runner_kwargs) -> result``, which
  `arl.agents.runner.FunctionRunner` runs as an `AgentRunner` (its result read by
  `arl.agents.runner.as_episode_result`). It gets ``env_id``, ``spec`` or ``config`` too when it
  has a parameter of that name (`AGENT_CONTEXT`).
- a **runner factory** (`RunnerFactory`), ``factory(client, spec, config, **runner_kwargs) ->
  AgentRunner``: ``client`` is the episode's OpenAI-compatible client, ``spec`` its
  `EpisodeSpec`, ``config`` the `ManagerConfig` whose sampling settings the runner should use
  (a parameter without a default). `ProxyEnvManager` calls its factory once per episode with
  its own config (so a validation manager's runners sample at the evaluation temperature).
  `gym_runner`, `tool_runner`, `push_runner` and `pull_runner` are the factories of the short
  names (`RUNNER_FACTORIES`).
- `make_runner_factory`, the one way to get a runner factory from what a run has: the run's
  `ProxyConfig` (``rollout.proxy.runner`` and ``runner_kwargs``), a runner name, an agent
  function, or a runner factory with keyword arguments to bind. `load_runner` resolves a name,
  ``gym`` or ``"package.module:name"``, to the factory or agent function it names (told apart by
  being async: `is_agent_function`). Signatures are checked there, not per episode.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import sys
from collections.abc import Callable
from typing import Any

from arl._renamed import old_names
from arl.agents.runner import AgentFunction, AgentRunner, FunctionRunner
from arl.config import ManagerConfig, ProxyConfig
from arl.rollout.base import EpisodeSpec

# (client, spec, config, **runner_kwargs) -> the episode's runner (see the module doc)
RunnerFactory = Callable[..., AgentRunner]


def gym_runner(client: Any, spec: EpisodeSpec, config: ManagerConfig, *, runner_cls: Any = None,
               **kwargs: Any) -> AgentRunner:
    """arl's `GymRunner` (or ``runner_cls``) playing ``spec.env_id`` with the manager's sampling
    settings, prompt style, history window and observation (its frames as ``image_url`` parts); ``kwargs`` go to the runner (e.g.
    ``conversation="step"`` for the step manager's self-contained prompts)."""
    from arl.agents.gym_runner import GymRunner, ToolCallRunner

    runner_cls = runner_cls or GymRunner
    if runner_cls is not ToolCallRunner:
        kwargs = {"prompt_style": config.prompt_style, "history_len": config.history_len,
                  "system_prompt": config.system_prompt, **kwargs}
        if config.observation != "text":  # the frames as image_url parts (a runner class of old takes no such keyword)
            kwargs.setdefault("observation", config.observation)
    elif config.observation != "text":
        raise ValueError(f"observation={config.observation!r}: the tool runner sends text only (GymRunner sends "
                         "the game's frames)")
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


RUNNER_FACTORIES: dict[str, RunnerFactory] = {
    "gym": gym_runner, "tool": tool_runner, "push": push_runner, "pull": pull_runner,
}


def load_runner(name: str) -> Callable[..., Any]:
    """The runner a name names: a short name's runner factory (`RUNNER_FACTORIES`), or the attribute
    ``"package.module:attribute"`` names as it is, a runner factory or an agent function
    (`is_agent_function`; `make_runner_factory` wraps one). ValueError for a name that does not load.

    >>> load_runner("gym") is gym_runner and load_runner("arl.rollout.runners:tool_runner") is tool_runner
    True
    """
    if name in RUNNER_FACTORIES:
        return RUNNER_FACTORIES[name]
    module_name, sep, attribute = name.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"rollout.proxy.runner={name!r}: use one of {', '.join(RUNNER_FACTORIES)} or "
                         "'package.module:factory'")
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


def _function_runner_factory(fn: AgentFunction) -> RunnerFactory:
    """The runner factory of the agent function ``fn``: ``factory(client, spec, config,
    **runner_kwargs)`` returns a `FunctionRunner` that awaits ``fn(client, seed, **runner_kwargs)``,
    with ``env_id=``, ``spec=``, ``config=`` added for the `AGENT_CONTEXT` names ``fn`` has as
    parameters (a ``**kwargs`` catch-all asks for none of them)."""
    wanted = _context_names(fn)

    def factory(client: Any, spec: EpisodeSpec, config: ManagerConfig, **runner_kwargs: Any) -> AgentRunner:
        context = {"env_id": spec.env_id, "spec": spec, "config": config}
        return FunctionRunner(client, fn, {**{k: context[k] for k in wanted}, **runner_kwargs})

    factory.agent_function = fn  # type: ignore[attr-defined]  (what it wraps, for a reader)
    return factory


def _context_names(fn: Any) -> list[str]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [name for name in AGENT_CONTEXT if name in params and params[name].kind in kinds]


def _check_call(where: str, target: Any, kwargs: dict[str, Any]) -> None:
    """ValueError unless ``target`` can be called as arl will call it: an agent function as
    ``agent(client, seed, [env_id=, spec=, config=,] **runner_kwargs)``, a factory as
    ``factory(client, spec, config, **runner_kwargs)``. ``where`` names it in the error."""
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
        raise ValueError(f"{where} is called as {form}{given}) (runner_kwargs: "
                         f"{sorted(kwargs) or 'none'}), which {getattr(target, '__name__', 'it')}{signature} "
                         f"does not take: {exc}") from None


def make_runner_factory(runner: ProxyConfig | str | Callable[..., Any], **runner_kwargs: Any) -> RunnerFactory:
    """The runner factory of ``runner`` with ``runner_kwargs`` bound, what `ProxyEnvManager` takes:

    - a `ProxyConfig`: the runner its ``runner`` names, with its ``runner_kwargs`` (give none
      here), checked against its ``transport`` (push needs ``http``, pull ``inprocess``);
    - a name, as ``rollout.proxy.runner`` takes it (`load_runner`: ``gym``, ``"package.module:name"``);
    - an agent function (`is_agent_function`), wrapped in a `FunctionRunner` per episode;
    - a runner factory (its keyword arguments bound).

    ValueError, before any episode, for a runner that does not load, whose signature does not
    take the call arl makes (`_check_call`), or that lacks what it needs (push, pull: a command).

        ProxyEnvManager(engine, config, make_runner_factory(gym_runner, runner_cls=ToolCallRunner))
    """
    proxy = runner if isinstance(runner, ProxyConfig) else None
    if proxy is not None:
        if runner_kwargs:
            raise TypeError("make_runner_factory(proxy_config): its runner_kwargs come from the ProxyConfig")
        runner, runner_kwargs = proxy.runner, dict(proxy.runner_kwargs)
    if isinstance(runner, str):
        where, target = f"rollout.proxy.runner={runner!r}", load_runner(runner)
    else:
        where, target = f"runner {getattr(runner, '__qualname__', runner)!r}", runner
    if target in (push_runner, pull_runner) and not runner_kwargs.get("command"):
        raise ValueError(f"{where} needs rollout.proxy.runner_kwargs.command (the agent program)")
    if proxy is not None and target is push_runner and proxy.transport != "http":
        raise ValueError("rollout.proxy.runner=push runs the agent in another process: set rollout.proxy.transport=http")
    if proxy is not None and target is pull_runner and proxy.transport != "inprocess":
        raise ValueError("rollout.proxy.runner=pull answers the agent's pipes through the episode's handler: "
                         "set rollout.proxy.transport=inprocess")
    _check_call(where, target, runner_kwargs)
    if is_agent_function(target):
        target = _function_runner_factory(target)
    return functools.partial(target, **runner_kwargs) if runner_kwargs else target


__all__ = ["AGENT_CONTEXT", "RUNNER_FACTORIES", "RunnerFactory", "check_pull_env", "env_spec", "gym_runner",
           "is_agent_function", "load_runner", "make_runner_factory", "pull_runner", "push_runner", "tool_runner"]


def _binder(factory: RunnerFactory) -> Callable[[ManagerConfig], Callable[[Any, EpisodeSpec], AgentRunner]]:
    """``factory`` as the old ``config -> (client, spec) -> runner`` (a RunnerBinder)."""
    return lambda config: functools.partial(_call_with, factory, config)


def _call_with(factory: RunnerFactory, config: ManagerConfig, client: Any, spec: EpisodeSpec) -> AgentRunner:
    return factory(client, spec, config)


# Old names, still importable with a DeprecationWarning: name -> its new name, or (what to use, the object)
__getattr__ = old_names(
    __name__, globals(), RUNNERS="RUNNER_FACTORIES", resolve_runner="load_runner",
    RunnerBinder=("RunnerFactory, which ProxyEnvManager calls with its config",
                  lambda: Callable[[ManagerConfig], Callable[[Any, EpisodeSpec], AgentRunner]]),
    agent_function_runner=("make_runner_factory(fn)", lambda: _function_runner_factory),
    bind_runner=("make_runner_factory(factory, **kwargs)",
                 lambda: lambda make, **kwargs: _binder(functools.partial(make, **kwargs))),
    runner_binder=("make_runner_factory(proxy_config)", lambda: lambda proxy: _binder(make_runner_factory(proxy))),
)
