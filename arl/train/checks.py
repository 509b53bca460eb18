"""What a config names that only code can check, checked before anything is built.

    config = check_config(load_config("my.yaml", overrides))   # ConfigError, or the config

`arl.config` validates every field it can alone (types, ranges, choices), but it imports no other
arl module (docs/architecture.md, import rules), so it cannot know which advantage estimators
exist, or whether an import path in a config imports. `check_config` asks the code that knows,
right after `load_config` and before an engine, a model or a run directory exists:
`Trainer.__init__` calls it. It checks ``algo.estimator``: a registered name or
``"package.module:function"`` (`arl.algo.estimators.resolve`: imported, its signature checked,
registered under that name).

Each problem is one line of the `ConfigError`, ``<what is wrong> @ <dotted.path>``, the form
`load_config` gives the fields it checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arl.algo import estimators
from arl.config import ConfigError, TrainConfig


def config_problems(config: TrainConfig, *, rollout: bool = True) -> list[tuple[str, str]]:
    """(dotted path, what is wrong) for each name in ``config`` that does not resolve; empty when
    all do. ``rollout=False`` leaves out what only the config's own rollout uses (a `Trainer`
    given its own manager runs something else)."""
    checks: list[tuple[str, Callable[[], Any]]] = [("algo.estimator", lambda: estimators.resolve(config.algo.estimator))]
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


__all__ = ["check_config", "config_problems"]
