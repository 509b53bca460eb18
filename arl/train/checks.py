"""What a config names that only code can check, checked before anything is built.

    config = check_config(load_config("my.yaml", overrides))   # ConfigError, or the config

`arl.config` validates every field it can alone (types, ranges, choices), but it imports no other
arl module (docs/architecture.md, import rules), so it cannot know which env ids gymnasium has,
which advantage estimators exist, or whether an import path in a config imports. `check_config`
asks the code that knows, right after `load_config` and before an engine, a model or a run
directory exists: ``arl train`` calls it, and so does `Trainer.__init__` (a config built in
Python passes the same gate). It checks the names a user's own code comes in by, all of them
``package.module:name`` import paths beside arl's short names:

- ``rollout.env_id``: a registered gymnasium id, or gymnasium's ``"package.module:Env-v0"``
  form, which imports the module (where your ``register_game`` runs) first
  (`arl.rollout.runners.env_spec`). Checked where arl plays the env itself: traj and step mode,
  the ``gym`` and ``tool`` runners, the format warm-start (``sft.steps > 0``); an agent of your
  own (a runner factory, an agent function, a push or pull program) may use it as a mere label.
- ``algo.estimator``: a registered name or ``"package.module:function"``
  (`arl.algo.estimators.resolve`: imported, its signature checked, registered under that name).
- ``rollout.proxy.runner`` (``mode: proxy``): a short name or ``"package.module:name"``, a
  runner factory or an agent function, imported and its signature checked against the call arl
  makes, with what it needs (push, pull: `arl.rollout.runners.make_runner_factory`).
- ``rollout.manager.fork.at`` (``fork.k > 0``): ``first``, ``every`` or ``"package.module:rule"``.

Each problem is one line of the `ConfigError`, ``<what is wrong> @ <dotted.path>``, the form
`load_config` gives the fields it checks, so a config with three mistakes says all three at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arl.algo import estimators
from arl.config import ConfigError, TrainConfig
from arl.rollout.fork import resolve_rule
from arl.rollout.runners import check_pull_env, env_spec, make_runner_factory

GAME_RUNNERS = ("gym", "tool")  # proxy runners that play rollout.env_id through arl's TextEnv / ToolEnv


def config_problems(config: TrainConfig, *, rollout: bool = True) -> list[tuple[str, str]]:
    """(dotted path, what is wrong) for each name in ``config`` that does not resolve; empty when
    all do. ``rollout=False`` leaves out what only the config's own rollout uses (the env id's
    game, the runner, the fork rule): a `Trainer` given its own manager runs something else.

    >>> from arl.config import load_config
    >>> config_problems(load_config(None, ["algo.estimator=ppo", "rollout.env_id=arl/FrozenLake-v9"]))
    ... # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
    [('rollout.env_id', "unknown env id 'arl/FrozenLake-v9' (...)..."),
     ('algo.estimator', "unknown advantage estimator 'ppo'; registered: reinforce, grpo, gigpo...")]
    """
    r = config.rollout
    plays_game = r.mode != "proxy" or r.proxy.runner in GAME_RUNNERS
    checks: list[tuple[str, Callable[[], Any]]] = []
    if (rollout and plays_game) or config.sft.warm_starts:  # both warm-starts play the game
        checks.append(("rollout.env_id", lambda: _check_env(r.env_id)))
    checks.append(("algo.estimator", lambda: estimators.resolve(config.algo.estimator)))
    if rollout and r.mode == "proxy":
        checks.append(("rollout.proxy.runner", lambda: _check_runner(config)))
    if rollout and r.manager.fork.k:
        checks.append(("rollout.manager.fork.at", lambda: resolve_rule(r.manager.fork.at, r.manager.fork.states)))
    problems = []
    for path, check in checks:
        try:
            check()
        except (ValueError, TypeError, ImportError) as exc:  # what resolving a name raises, and nothing else
            problems.append((path, str(exc)))
    return problems


def check_config(config: TrainConfig, *, rollout: bool = True) -> TrainConfig:
    """``config`` when every name in it resolves (`config_problems`), else `ConfigError` listing
    each problem as ``<what is wrong> @ <dotted.path>``. Importing a user's module runs it, once."""
    problems = config_problems(config, rollout=rollout)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(f"{message} @ {path}" for path, message in problems))
    return config


def check_estimator_reads(estimator: str, sample_mode: str) -> None:
    """ConfigError when ``estimator`` cannot read the samples a manager of ``sample_mode`` makes
    (its ``mode``: ``traj``, ``step``, ``proxy-step``, ``proxy-traj``, ...).

    GiGPO on ``proxy-traj`` samples: a conversation branch records no turns (`Sample.turns`, which
    trajectory-mode samples carry), so it is one GiGPO row, every anchor group is that row alone,
    the step term is 0 and only the episode term would train, under GiGPO's name.

    >>> check_estimator_reads("gigpo", "traj"), check_estimator_reads("grpo", "proxy-traj")
    (None, None)
    >>> check_estimator_reads("gigpo", "proxy-traj")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    arl.config.ConfigError: algo.estimator=gigpo with rollout.proxy.granularity=traj: ...
    """
    if estimator == "gigpo" and sample_mode == "proxy-traj":
        raise ConfigError("algo.estimator=gigpo with rollout.proxy.granularity=traj: a conversation branch is one "
                          "GiGPO row with no turns, so every anchor group is a singleton, the step term is 0 and only "
                          "the episode term would train: use rollout.proxy.granularity=step (one sample per model "
                          "call) for GiGPO, or algo.estimator=grpo for a trajectory-level advantage")


def _check_env(env_id: str) -> None:
    import gymnasium as gym

    try:
        env_spec(env_id)
    except (gym.error.Error, ImportError) as exc:
        arl_ids = sorted(k for k in gym.registry if k.startswith("arl/"))
        raise ValueError(
            f"unknown env id {env_id!r} ({type(exc).__name__}: {exc}); arl's: {', '.join(arl_ids)}; a game of your "
            "own: 'my_pkg.my_module:my/Game-v0' imports my_pkg.my_module (where register_game runs) first") from None


def _check_runner(config: TrainConfig) -> None:
    p = config.rollout.proxy
    make_runner_factory(p)  # loads it, checks the signature and what push / pull need
    if p.runner == "pull":
        check_pull_env(config.rollout.env_id, config.rollout.manager.env_kwargs)


__all__ = ["check_config", "check_estimator_reads", "config_problems"]
