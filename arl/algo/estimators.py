"""The advantage estimators by name: what ``algo.estimator`` selects, in one table.

An estimator maps a batch of samples to one advantage per sample:

    advantages, stats = estimate("gigpo", samples, settings)

``samples`` are anything with the `arl.rollout.Sample` fields the estimator reads
(``episode_score``, ``step_score``, ``group_id``, ``traj_id``, ``step``, ``state_key``,
``action_valid``; the forked rows of `arl.rollout.fork` also ``fork_id``, ``fork_rewards``,
``branch``, read where present); ``settings`` anything with the `arl.config.AlgoConfig` fields it reads
(``gamma``, ``step_weight``, ``gigpo_norm``, ``invalid_penalty``; GiGPO's ablation knobs
``episode_stats`` and ``singleton`` where present). ``stats`` are plain floats named without a
namespace (the trainer logs them under ``train/``): ``adv_abs_mean`` always, and an estimator's
own (``gigpo_anchor_group_size_mean``, ...).

The trainer, `benchmarks/credit.py` and notebook 02 all call `estimate`. A new estimator is one
function ``fn(samples, settings) -> (advantages, stats)`` in your own package, selected by its
import path, ``algo.estimator: my_pkg.my_mod:my_fn`` (`resolve` imports it, checks its signature
and registers it under that name; no edit inside arl), or by a short name after ``register(NAME,
fn)`` in code that runs before the trainer. An unknown name or an import path that does not give
such a function is refused before anything is built (`arl.train.checks`, at ``algo.estimator``).

    >>> import types
    >>> S = lambda score, group: types.SimpleNamespace(episode_score=score, group_id=group)
    >>> adv, stats = estimate("grpo", [S(1.0, "a"), S(0.0, "a")], types.SimpleNamespace())
    >>> adv.round(4).tolist(), {k: round(v, 4) for k, v in stats.items()}
    ([0.7071, -0.7071], {'adv_abs_mean': 0.7071})
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from arl.algo.advantages import discounted_returns, gigpo, gigpo_forked, grpo, reinforce

Estimator = Callable[[Sequence[Any], Any], tuple[np.ndarray, dict[str, float]]]
_REGISTRY: dict[str, Estimator] = {}


def register(name: str, fn: Estimator) -> Estimator:
    """Make ``fn`` the estimator ``algo.estimator: name`` selects (a name taken twice is an error)."""
    if name in _REGISTRY and _REGISTRY[name] is not fn:
        raise ValueError(f"an advantage estimator named {name!r} is already registered")
    _REGISTRY[name] = fn
    return fn


def names() -> tuple[str, ...]:
    """The registered names: the built-in ones, those given to `register`, the import paths resolved so far."""
    return tuple(_REGISTRY)


def resolve(name: str) -> Estimator:
    """The estimator ``name`` selects: a registered name, or an import path
    ``"package.module:function"`` (``function`` may be dotted: ``module:Class.method``), imported,
    checked and registered under ``name``, so that `names` lists it and the next call is a look-up.

    Raises ValueError saying what is wrong: a name nobody registered (naming the registered ones),
    a module that does not import (with the import error), an attribute it lacks, or an object
    that cannot be called as ``fn(samples, settings)``. Importing runs the module's code, as
    ``import`` does; resolving a name twice imports once.

    >>> resolve("grpo") is _grpo
    True
    >>> resolve("math:sqrt")
    Traceback (most recent call last):
    ...
    ValueError: estimator 'math:sqrt' must take (samples, settings): sqrt(x, /) cannot (too many positional arguments)
    >>> resolve("math:tau")
    Traceback (most recent call last):
    ...
    ValueError: estimator 'math:tau' is a float, not a function of (samples, settings)
    >>> resolve("ppo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown advantage estimator 'ppo'; registered: reinforce, grpo, gigpo... or an import path 'package.module:function')
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    module_name, sep, attribute = name.partition(":")
    if not (sep and module_name and attribute):
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {', '.join(_REGISTRY)} "
                         "(more with register(name, fn), or an import path 'package.module:function')")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:  # ModuleNotFoundError: the module, or something it imports
        raise ValueError(f"estimator {name!r}: cannot import {module_name!r} ({exc}); is its package installed "
                         "or on PYTHONPATH?") from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"estimator {name!r}: {module_name!r} has no {attribute!r}") from None
        target = getattr(target, part)
    _check_signature(name, target)
    return register(name, target)


def _check_signature(name: str, fn: Any) -> None:
    """Refuse ``fn`` unless it can be called as ``fn(samples, settings)``."""
    if not callable(fn):
        raise ValueError(f"estimator {name!r} is a {type(fn).__name__}, not a function of (samples, settings)")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: called as they are, errors come at the call
        return
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise ValueError(f"estimator {name!r} must take (samples, settings): "
                         f"{getattr(fn, '__name__', 'it')}{signature} cannot ({exc})") from None
    if inspect.iscoroutinefunction(fn):
        raise ValueError(f"estimator {name!r} is async: an estimator is a plain function of (samples, settings)")


def estimate(name: str, samples: Sequence[Any], settings: Any) -> tuple[np.ndarray, dict[str, float]]:
    """(one advantage per sample, stats) from the estimator ``name`` (`resolve`); no samples:
    (empty, {}). ValueError when it returns anything but an array of one finite advantage per
    sample (or per sample and token: shape (len(samples), L)) and a dict of stats."""
    fn = resolve(name)
    if not samples:
        return np.zeros(0), {}
    out = fn(samples, settings)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise ValueError(f"estimator {name!r} must return (advantages, stats dict), got {type(out).__name__}")
    adv = np.asarray(out[0], dtype=np.float64)
    if adv.ndim not in (1, 2) or len(adv) != len(samples):
        raise ValueError(f"estimator {name!r} returned advantages of shape {adv.shape} for {len(samples)} samples "
                         "(one per sample)")
    if not np.isfinite(adv).all():
        raise ValueError(f"estimator {name!r} returned {int((~np.isfinite(adv)).sum())} non-finite advantages")
    return adv, {**out[1], "adv_abs_mean": _abs_mean(adv, samples)}


def _abs_mean(adv: np.ndarray, samples: Sequence[Any]) -> float:
    """Mean |A| per sample, or, for per-token advantages, over the response tokens (where the loss
    reads them; a prompt's zeros would dilute it by the prompt's length)."""
    if adv.ndim == 1:
        return float(np.abs(adv).mean())
    values = [np.abs(row[: len(s.response_mask)][np.asarray(s.response_mask, dtype=bool)])
              for row, s in zip(adv, samples, strict=True) if hasattr(s, "response_mask")]
    values = [v for v in values if v.size]
    return float(np.concatenate(values).mean()) if values else float(np.abs(adv).mean())


def _no_branches(name: str, samples: Sequence[Any]) -> None:
    """Refuse forked branch rows: an estimator that reads each row as (a step of) an episode would
    count every branch as one more episode of its group."""
    if any(getattr(s, "branch", False) for s in samples):
        raise ValueError(f"estimator {name!r} does not read forked branch rows (rollout.manager.fork): use gigpo")


def _reinforce(samples: Sequence[Any], settings: Any) -> tuple[np.ndarray, dict[str, float]]:
    """REINFORCE without a baseline (`arl.algo.reinforce`) on the return from each sample's first
    action on: a trajectory sample holds its whole episode, so it gets ``episode_score``; a step
    sample gets its discounted return-to-go from ``step_score`` (`discounted_returns`, ``gamma``),
    not its immediate reward alone, which would credit no action with what it led to. A batch
    whose rows repeat a (traj_id, step) pair holds several trajectory samples of one episode (the
    proxy tracker's branches): each gets ``episode_score``.

    >>> import types
    >>> S = lambda r, R, t, k: types.SimpleNamespace(step_score=r, episode_score=R, traj_id=t, step=k)
    >>> adv, _ = estimate("reinforce", [S(0.0, 1.0, "a", 0), S(1.0, 1.0, "a", 1)], types.SimpleNamespace(gamma=0.5))
    >>> adv.tolist()  # the first step is credited with half the reward it led to
    [0.5, 1.0]
    """
    _no_branches("reinforce", samples)
    keys = [(s.traj_id, s.step) for s in samples]
    if len(set(keys)) < len(keys):
        return reinforce([s.episode_score for s in samples]), {}
    returns = discounted_returns([s.step_score for s in samples], [s.traj_id for s in samples],
                                 [s.step for s in samples], gamma=settings.gamma)
    return reinforce(returns), {}


def _grpo(samples: Sequence[Any], settings: Any) -> tuple[np.ndarray, dict[str, float]]:
    """Trajectory level: ``episode_score`` normalized within its group (`arl.algo.grpo`); step
    samples carry their episode's ``episode_score``, so every step of an episode gets the same
    advantage. Reads no ``step_score``."""
    _no_branches("grpo", samples)
    return grpo([s.episode_score for s in samples], [s.group_id for s in samples]), {}


def _state_keys(samples: Sequence[Any]) -> list[Any]:
    """Each sample's ``state_key``; a sample-like object from before the rename that has only
    ``state_hash`` (its old name) is still read, with a DeprecationWarning.

    >>> import types, warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _state_keys([types.SimpleNamespace(state_key="a"), types.SimpleNamespace(state_hash="b")])
    ['a', 'b']
    >>> print(caught[0].message)
    a sample's state_hash is deprecated: use state_key
    """
    keys, old = [], False
    for s in samples:
        if not hasattr(s, "state_key") and hasattr(s, "state_hash"):
            keys.append(s.state_hash)
            old = True
        else:
            keys.append(s.state_key)
    if old:
        # stacklevel 4: estimate's caller
        warnings.warn("a sample's state_hash is deprecated: use state_key", DeprecationWarning, stacklevel=4)
    return keys


def _gigpo(samples: Sequence[Any], settings: Any) -> tuple[np.ndarray, dict[str, float]]:
    """GiGPO (`arl.algo.gigpo`): the episode term (``episode_score`` normalized within its group)
    plus ``step_weight`` x the step term (the discounted return-to-go of ``step_score``, normalized
    within its anchor group: the rows of a group with one ``state_key``); its anchor-group statistics come back as ``gigpo_*``. A batch with forked rows
    (`arl.rollout.fork`) goes to `arl.algo.gigpo_forked`: the same terms, with the fork groups as
    the anchors of the forked states (``gigpo_fork_*`` stats besides). Trajectory samples that list
    their turns (``turns``, `arl.rollout.records.TurnSpan`) go to `_gigpo_per_turn`: one step row per
    turn, one advantage per token."""
    # the settings every GiGPO call takes (the ablation knobs only where the settings have them)
    shared = dict(gamma=settings.gamma, step_weight=settings.step_weight, norm=settings.gigpo_norm,
                  invalid_penalty=getattr(settings, "invalid_penalty", 0.0),
                  **{k: getattr(settings, k) for k in ("episode_stats", "singleton") if hasattr(settings, k)})
    if any(getattr(s, "turns", ()) for s in samples):
        return _gigpo_per_turn(samples, shared)
    columns = (
        [s.episode_score for s in samples], [s.step_score for s in samples], [s.group_id for s in samples],
        [s.traj_id for s in samples], [s.step for s in samples], _state_keys(samples),
    )
    options = dict(shared, action_valid=[s.action_valid for s in samples])
    fork_ids = [getattr(s, "fork_id", None) for s in samples]
    if any(f is not None for f in fork_ids):
        adv, stats = gigpo_forked(*columns, fork_ids, [getattr(s, "fork_rewards", ()) for s in samples],
                                  [getattr(s, "branch", False) for s in samples], **options)
    else:
        adv, stats = gigpo(*columns, **options)
    return adv, {f"gigpo_{k}": float(v) for k, v in stats.items()}


def _gigpo_per_turn(samples: Sequence[Any], shared: dict[str, Any]) -> tuple[np.ndarray, dict[str, float]]:
    """GiGPO on trajectory samples: every turn of every sample is one step row (its reward, its
    state key, its validity, step t of its trajectory), `arl.algo.gigpo` gives each row its
    advantage A(i, t), and A(i, t) goes on turn t's reply tokens (``input_ids[start:end]``, where
    ``response_mask`` is 1); every other token gets 0. Returns (B, L) with L the longest sample.
    The same rows verl's ``arl_gigpo`` builds from the agent loop's turn spans
    (`arl.integrations.verl.gigpo.token_advantages`), so both trainers credit a traj episode's
    turns alike. A turn without a state key is its own anchor (a singleton). A batch that mixes
    samples with turns and without is refused: a step sample is a row already, a trajectory sample
    without turns would be read as one.

    >>> import types
    >>> T = lambda a, b, r, k: types.SimpleNamespace(start=a, end=b, reward=r, state_key=k, action_valid=True)
    >>> S = lambda R, traj, turns: types.SimpleNamespace(episode_score=R, group_id="g", traj_id=traj,
    ...     input_ids=[0] * 6, response_mask=[0, 1, 0, 1, 1, 0], turns=turns, action_valid=True)
    >>> won = S(1.0, "A", [T(1, 2, 0.0, "s0"), T(3, 5, 1.0, "s1")])   # two turns: s0, then s1 to the goal
    >>> lost = S(0.0, "B", [T(1, 2, 0.0, "s0"), T(3, 5, 0.0, "s2")])  # s0 too, then a hole
    >>> settings = types.SimpleNamespace(gamma=0.5, step_weight=1.0, gigpo_norm="mean_norm")
    >>> adv, stats = estimate("gigpo", [won, lost], settings)
    >>> adv.tolist()  # the episode term +-0.5; at s0 (anchor of 2) returns 0.5 vs 0: +-0.25 more
    [[0.0, 0.75, 0.0, 0.5, 0.5, 0.0], [0.0, -0.75, 0.0, -0.5, -0.5, 0.0]]
    """
    if not all(getattr(s, "turns", ()) for s in samples):
        raise ValueError("gigpo got a batch that mixes trajectory samples with turns (Sample.turns) and samples "
                         "without: one manager's samples are one kind")
    rows = [(i, t, span) for i, s in enumerate(samples) for t, span in enumerate(s.turns)]
    keys = [span.state_key if span.state_key is not None else f"{samples[i].traj_id}/{t}" for i, t, span in rows]
    adv, stats = gigpo(
        [samples[i].episode_score for i, _, _ in rows], [span.reward for _, _, span in rows],
        [samples[i].group_id for i, _, _ in rows], [samples[i].traj_id for i, _, _ in rows],
        [t for _, t, _ in rows], keys, action_valid=[span.action_valid for _, _, span in rows], **shared)
    out = np.zeros((len(samples), max(len(s.input_ids) for s in samples)))
    for (i, _, span), a in zip(rows, adv, strict=True):
        mask = np.asarray(samples[i].response_mask[span.start:span.end], dtype=np.float64)
        out[i, span.start:span.end] = a * mask
    return out, {f"gigpo_{k}": float(v) for k, v in stats.items()}


register("reinforce", _reinforce)
register("grpo", _grpo)
register("gigpo", _gigpo)

__all__ = ["Estimator", "estimate", "names", "register", "resolve"]
