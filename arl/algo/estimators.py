"""The advantage estimators by name: what ``algo.estimator`` selects, in one table.

An estimator maps a batch of samples to one advantage per sample:

    advantages, stats = estimate("gigpo", samples, settings)

``samples`` are anything with the `arl.rollout.Sample` fields the estimator reads (``score``,
``episode_score``, ``step_score``, ``group_id``, ``traj_id``, ``step``, ``state_hash``,
``action_valid``; the forked rows of `arl.rollout.fork` also ``fork_id``, ``fork_rewards``,
``branch``, read where present); ``settings`` anything with the `arl.config.AlgoConfig` fields it reads
(``gamma``, ``step_weight``, ``gigpo_mode``, ``invalid_penalty``; GiGPO's ablation knobs
``episode_stats`` and ``singleton`` where present). ``stats`` are plain floats named without a
namespace (the trainer logs them under ``train/``): ``adv_abs_mean`` always, and an estimator's
own (``gigpo_anchor_group_size_mean``, ...).

The trainer, `benchmarks/credit.py` and notebook 02 all call `estimate`; a new estimator is one
function and one `register` call, then ``algo.estimator: NAME`` selects it (the Trainer refuses a
name nobody registered before it builds anything).

    >>> import types
    >>> S = lambda score, group: types.SimpleNamespace(score=score, episode_score=score, group_id=group)
    >>> adv, stats = estimate("grpo", [S(1.0, "a"), S(0.0, "a")], types.SimpleNamespace())
    >>> adv.round(4).tolist(), {k: round(v, 4) for k, v in stats.items()}
    ([0.7071, -0.7071], {'adv_abs_mean': 0.7071})
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from arl.algo.advantages import gigpo, gigpo_forked, grpo, reinforce

Estimator = Callable[[Sequence[Any], Any], tuple[np.ndarray, dict[str, float]]]
_REGISTRY: dict[str, Estimator] = {}


def register(name: str, fn: Estimator) -> Estimator:
    """Make ``fn`` the estimator ``algo.estimator: name`` selects (a name taken twice is an error)."""
    if name in _REGISTRY and _REGISTRY[name] is not fn:
        raise ValueError(f"an advantage estimator named {name!r} is already registered")
    _REGISTRY[name] = fn
    return fn


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def estimate(name: str, samples: Sequence[Any], settings: Any) -> tuple[np.ndarray, dict[str, float]]:
    """(one advantage per sample, stats) from the estimator called ``name``; no samples: (empty, {})."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {', '.join(_REGISTRY)}")
    if not samples:
        return np.zeros(0), {}
    adv, stats = _REGISTRY[name](samples, settings)
    return adv, {**stats, "adv_abs_mean": float(np.abs(adv).mean())}


def _no_branches(name: str, samples: Sequence[Any]) -> None:
    """Refuse forked branch rows: an estimator that reads each row as (a step of) an episode would
    count every branch as one more episode of its group."""
    if any(getattr(s, "branch", False) for s in samples):
        raise ValueError(f"estimator {name!r} does not read forked branch rows (rollout.manager.fork): use gigpo")


def _reinforce(samples: Sequence[Any], settings: Any) -> tuple[np.ndarray, dict[str, float]]:
    """Each sample's own score minus the batch mean (`arl.algo.reinforce`)."""
    _no_branches("reinforce", samples)
    return reinforce([s.score for s in samples]), {}


def _grpo(samples: Sequence[Any], settings: Any) -> tuple[np.ndarray, dict[str, float]]:
    """Trajectory level: the episode's score normalized within its group (`arl.algo.grpo`); step
    samples carry their episode's score, so every step of an episode gets the same advantage."""
    _no_branches("grpo", samples)
    return grpo([s.episode_score for s in samples], [s.group_id for s in samples]), {}


def _gigpo(samples: Sequence[Any], settings: Any) -> tuple[np.ndarray, dict[str, float]]:
    """GiGPO (`arl.algo.gigpo`): the episode term plus ``step_weight`` x the step term over anchor
    states; its anchor-group statistics come back as ``gigpo_*``. A batch with forked rows
    (`arl.rollout.fork`) goes to `arl.algo.gigpo_forked`: the same terms, with the fork groups as
    the anchors of the forked states (``gigpo_fork_*`` stats besides)."""
    extra = {k: getattr(settings, k) for k in ("episode_stats", "singleton") if hasattr(settings, k)}
    columns = (
        [s.episode_score for s in samples], [s.step_score for s in samples], [s.group_id for s in samples],
        [s.traj_id for s in samples], [s.step for s in samples], [s.state_hash for s in samples],
    )
    options = dict(gamma=settings.gamma, step_weight=settings.step_weight, mode=settings.gigpo_mode,
                   invalid_penalty=getattr(settings, "invalid_penalty", 0.0),
                   action_valid=[s.action_valid for s in samples], **extra)
    fork_ids = [getattr(s, "fork_id", None) for s in samples]
    if any(f is not None for f in fork_ids):
        adv, stats = gigpo_forked(*columns, fork_ids, [getattr(s, "fork_rewards", ()) for s in samples],
                                  [getattr(s, "branch", False) for s in samples], **options)
    else:
        adv, stats = gigpo(*columns, **options)
    return adv, {f"gigpo_{k}": float(v) for k, v in stats.items()}


register("reinforce", _reinforce)
register("grpo", _grpo)
register("gigpo", _gigpo)

__all__ = ["Estimator", "estimate", "names", "register"]
