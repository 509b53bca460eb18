"""Advantage estimators: pure functions from sample fields to one float per sample.

Every function takes plain sequences, numpy arrays or CPU torch tensors (one entry per sample /
row) and returns a float64 numpy array with one advantage per row; the trainer broadcasts each
row's scalar to that row's response tokens. Nothing here knows about tokens, models or arl's
records, so each estimator can be checked by hand (tests/algo) and read next to its paper.

Conventions shared by all estimators (docs/reference.md §3.1):
- Group statistics use the unbiased std (ddof=1).
- A singleton group has no baseline to compare against: its advantage is 0 (ROLL's choice;
  verl-agent instead passes the raw score through with mean 0 / std 1: `gigpo(singleton="raw")`).
- A constant group (std <= 1e-6) carries no learning signal: its advantage is exactly 0
  with or without the std division (GRPO's ``std_normalize``, GiGPO's ``norm``), so "all-zero
  advantage" filters can test for equality.

Where each estimator lives: this module defines the per-sample ones, REINFORCE and GRPO, which
score a row alone or against its group. GiGPO, which also needs each row's trajectory, step and
state, is in `step_level`; GiGPO over forked anchor groups (`arl.rollout.fork`'s rows) in
`forked`; the input handling and `group_normalize` all build on are in `_groups`. This module
re-exports all of it, so it stays the one place to import estimators from.
"""

from __future__ import annotations

import numpy as np

from arl.algo import forked, step_level
from arl.algo._groups import (
    CONSTANT_STD,
    Floats,
    Keys,
    _check_lengths,
    _floats,
    _group_rows,
    _keys,
    group_normalize,
)
from arl.algo.forked import fork_returns, gigpo_forked  # noqa: F401  (re-exported)
from arl.algo.step_level import (  # noqa: F401  (re-exported)
    EpisodeStats,
    Norm,
    Singleton,
    discounted_returns,
    episode_advantages,
    gigpo,
    step_advantages,
)

__all__ = ["CONSTANT_STD", "grpo", "group_normalize", "reinforce", *step_level.__all__, *forked.__all__]

# ----------------------------------------------------------------------------------------------
# REINFORCE and GRPO


def reinforce(scores: Floats) -> np.ndarray:
    """REINFORCE without a baseline: A_i = R_i.

    >>> reinforce([1.0, 0.0, -0.5])
    array([ 1. ,  0. , -0.5])
    """
    return _floats("scores", scores).copy()


def grpo(
    scores: Floats,
    group_ids: Keys,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
    whiten: bool = False,
    clip: float | None = None,
) -> np.ndarray:
    """GRPO: normalise each score inside its group (members played the same seed).

        A_i = (R_i - mean_g) / (std_g + eps)     std unbiased (ddof=1)
        A_i = R_i - mean_g                       with std_normalize=False (Dr. GRPO style)

    A_i = 0 for a singleton group and for a constant group (std_g <= 1e-6).

    Options, off by default (docs/reference.md §3.1):
      whiten: after the group step, A <- (A - mean(A)) / (std(A) + eps) over the whole batch, one
        value per sample (a sample-level whitening: long samples do not weigh more);
        a batch with std(A) <= 1e-6 gives all zeros.
      clip: finally A <- clip(A, -clip, clip). (ROLL ships clip=0.2 after whitening, which turns
        the update into a near sign-gradient; prefer None.)

    Trajectory samples pass one row per episode. Step-level rows (verl-agent style) work with the
    same call when every row carries its episode's score (`scores=episode_scores`): the group
    statistics are then pooled over step-rows, so long trajectories weigh more. Singleton groups
    give 0 here too (verl-agent would pass R through unnormalised).

    Worked example: group "a" = [1, 0, 0] has mean 1/3 and unbiased std sqrt(1/3) = 0.5774, so
    A = [0.6667, -0.3333, -0.3333] / 0.5774; group "b" is a singleton.

    >>> grpo([1.0, 0.0, 0.0, 5.0], ["a", "a", "a", "b"]).round(3)
    array([ 1.155, -0.577, -0.577,  0.   ])
    >>> grpo([1.0, 0.0, 0.0, 5.0], ["a", "a", "a", "b"], std_normalize=False).round(4)
    array([ 0.6667, -0.3333, -0.3333,  0.    ])
    """
    scores_ = _floats("scores", scores)
    keys = _keys(group_ids)
    _check_lengths(scores=scores_, group_ids=keys)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if clip is not None and clip <= 0:
        raise ValueError(f"clip must be > 0 or None, got {clip}")

    adv = group_normalize(scores_, _group_rows(keys), std_normalize=std_normalize, eps=eps)

    if whiten:
        std = adv.std(ddof=1) if len(adv) > 1 else 0.0
        adv = (adv - adv.mean()) / (std + eps) if std > CONSTANT_STD else np.zeros_like(adv)
    if clip is not None:
        adv = np.clip(adv, -clip, clip)
    return adv
