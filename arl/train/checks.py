"""What a config names that only code can check, checked before anything is built.

    config = check_config(load_config("my.yaml", overrides))   # ConfigError, or the config

`arl.config` validates every field it can alone (types, ranges, choices), but it imports no other
arl module (docs/architecture.md, import rules), so it cannot know which advantage estimators
exist, or whether an import path in a config imports. `check_config`
asks the code that knows, right after `load_config` and before an engine, a model or a run
directory exists: ``arl train`` calls it, and so does `Trainer.__init__` (a config built in
Python passes the same gate). It checks the names a user's own code comes in by, all of them
``package.module:name`` import paths beside arl's short names:

- ``algo.estimator``: a registered name or ``"package.module:function"``
  (`arl.algo.estimators.resolve`: imported, its signature checked, registered under that name).
- ``rollout.proxy.runner`` (``mode: proxy``): a short name or ``"package.module:name"``, a
  runner factory or an agent function, imported and its signature checked against the call arl
  makes, with what it needs (push, pull: `arl.rollout.runners.runner_binder`).

Each problem is one line of the `ConfigError`, ``<what is wrong> @ <dotted.path>``, the form
`load_config` gives the fields it checks, so a config with three mistakes says all three at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arl.algo import estimators
from arl.config import ConfigError, TrainConfig
from arl.rollout.runners import check_pull_env, runner_binder


def config_problems(config: TrainConfig, *, rollout: bool = True) -> list[tuple[str, str]]:
    """(dotted path, what is wrong) for each name in ``config`` that does not resolve; empty when
    all do. ``rollout=False`` leaves out what only the config's own rollout uses (the runner): a
    `Trainer` given its own manager runs something else."""
    r = config.rollout
    checks: list[tuple[str, Callable[[], Any]]] = [("algo.estimator", lambda: estimators.resolve(config.algo.estimator))]
    if rollout and r.mode == "proxy":
        checks.append(("rollout.proxy.runner", lambda: _check_runner(config)))
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


def _check_runner(config: TrainConfig) -> None:
    p = config.rollout.proxy
    runner_binder(p)  # resolves, checks the signature and what push / pull need
    if p.runner == "pull":
        check_pull_env(config.rollout.env_id, config.rollout.manager.env_kwargs)


__all__ = ["check_config", "config_problems"]
