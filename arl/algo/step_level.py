"""GiGPO's step-level estimators: one row per environment step, grouped by trajectory and state.

Split from `advantages` because these need what REINFORCE and GRPO never look at: the trajectory
a row belongs to, its step index and the state it acted in. Read top to bottom they are GiGPO
(Feng et al. 2025): discounted step returns, the episode term, the anchor-state step term, and
`gigpo`, which combines them. The conventions in `advantages`' docstring hold here too (they live
in `_groups.group_normalize`). `arl.algo` and `arl.algo.advantages` re-export every public name,
so callers need not know this module exists.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Literal, get_args

import numpy as np

from arl.algo._groups import (
    CONSTANT_STD,
    Floats,
    Keys,
    _check_lengths,
    _floats,
    _group_rows,
    _keys,
    _renamed_keywords,
    group_normalize,
)

__all__ = [
    "EpisodeStats",
    "Norm",
    "Singleton",
    "discounted_returns",
    "episode_advantages",
    "gigpo",
    "step_advantages",
]

# GiGPO's normalisation of both terms, its "norm" (docs/architecture.md, "Glossary"; config key
# `algo.gigpo_norm`): subtract the group mean, or also divide by the group's std + eps.
Norm = Literal["mean_norm", "mean_std_norm"]
NORMS: tuple[str, ...] = get_args(Norm)
# GiGPO's episode term: statistics over each group's episodes (arl) or over its step-rows
# (verl-agent's default, `compute_mean_std_cross_steps=True`: a T-step episode counts T times).
EpisodeStats = Literal["episodes", "steps"]
# A group with a single member: advantage 0 (arl, ROLL) or the raw score, mean 0 / std 1 (verl-agent).
Singleton = Literal["zero", "raw"]

# Anchor key of a row without a state key: (private sentinel, row) never equals a real key.
_NO_STATE = object()


# ----------------------------------------------------------------------------------------------
# option checks


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; allowed: {', '.join(NORMS)}")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(allowed)}")


# ----------------------------------------------------------------------------------------------
# GiGPO


def discounted_returns(step_rewards: Floats, traj_ids: Keys, steps: Floats, *, gamma: float) -> np.ndarray:
    """Discounted return of every step-row inside its trajectory.

        G_t = r_t + gamma * G_{t+1},   G_T = r_T (last row of the trajectory; no bootstrap, also
                                        when the episode was truncated)

    Rows may come in any order; inside a trajectory they are chained in increasing `steps`
    order. A missing step index is not filled in: the next present row is treated as t+1.

    >>> discounted_returns([0.0, 1.0, 0.0, 0.0], ["A", "A", "B", "B"], [0, 1, 0, 1], gamma=0.5)
    array([0.5, 1. , 0. , 0. ])
    """
    rewards = _floats("step_rewards", step_rewards)
    keys = _keys(traj_ids)
    step_idx = _floats("steps", steps)
    _check_lengths(step_rewards=rewards, traj_ids=keys, steps=step_idx)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")

    returns = np.zeros_like(rewards)
    for rows in _group_rows(keys):
        ordered = rows[np.argsort(step_idx[rows], kind="stable")]
        if len(np.unique(step_idx[ordered])) != len(ordered):
            raise ValueError(f"trajectory {keys[rows[0]]!r} has two rows with the same step index")
        future = 0.0
        for row in ordered[::-1]:  # walk backwards from the last step
            future = rewards[row] + gamma * future
            returns[row] = future
    return returns


@_renamed_keywords(mode="norm")
def episode_advantages(
    episode_scores: Floats,
    group_ids: Keys,
    traj_ids: Keys,
    *,
    norm: Norm = "mean_norm",
    eps: float = 1e-6,
    stats: EpisodeStats = "episodes",
    singleton: Singleton = "zero",
) -> tuple[np.ndarray, np.ndarray]:
    """GiGPO's episode term A_E, computed over EPISODES and broadcast to their step-rows.

    Every row of a trajectory carries the same episode score R_i; each trajectory counts once:

        A_E(i) = R_i - mean_g                        (mean_norm)
        A_E(i) = (R_i - mean_g) / (std_g + eps)      (mean_std_norm, unbiased std)

    where g runs over the trajectories of i's group. Singleton/constant groups give 0.

    Two options reproduce verl-agent's `episode_norm_reward` (gigpo/core_gigpo.py) exactly:
      stats="steps": mean_g and std_g run over the group's STEP-ROWS instead of its episodes
        (verl-agent's default `compute_mean_std_cross_steps=True`), so an episode of T steps
        counts T times and long episodes pull the baseline towards their score.
      singleton="raw": a group whose population (episodes, or step-rows with stats="steps") has a
        single member uses mean 0 and std 1, so its raw score R passes through (R / (1 + eps) in
        mean_std_norm) instead of 0. With stats="steps" a one-episode group of several steps is
        not a singleton: its rows share one score, so the group is constant and gives 0.

    Returns (A_E per row, the divisor s_g per row): s_g = std_g + eps for a non-degenerate group in
    mean_std_norm (1 + eps for a "raw" singleton), else 1 — the factor a per-row change of R (the
    invalid-action penalty) is divided by so it lands on the same scale as A_E.

    Worked example: episode A has two steps and R = 1, episode B one step and R = 0. Over episodes
    the mean is 1/2; over step-rows it is 2/3.

    >>> a_e, scale = episode_advantages([1, 1, 0, 0], ["g"] * 4, ["A", "A", "B", "B"])
    >>> a_e
    array([ 0.5,  0.5, -0.5, -0.5])
    >>> episode_advantages([1, 1, 0], ["g"] * 3, ["A", "A", "B"], stats="steps")[0].round(4)
    array([ 0.3333,  0.3333, -0.6667])
    >>> episode_advantages([1, 0.5], ["g", "h"], ["A", "B"], singleton="raw")[0]
    array([1. , 0.5])
    """
    _check_norm(norm)
    _check_choice("stats", stats, get_args(EpisodeStats))
    _check_choice("singleton", singleton, get_args(Singleton))
    scores = _floats("episode_scores", episode_scores)
    groups, trajs = _keys(group_ids), _keys(traj_ids)
    _check_lengths(episode_scores=scores, group_ids=groups, traj_ids=trajs)

    # One entry per trajectory: its score and its group. Check the rows agree on both.
    traj_rows = _group_rows(trajs)
    traj_score = np.empty(len(traj_rows))
    traj_group: list[Hashable] = []
    for k, rows in enumerate(traj_rows):
        if not np.allclose(scores[rows], scores[rows[0]], rtol=0.0, atol=1e-9):
            raise ValueError(f"trajectory {trajs[rows[0]]!r} rows disagree on episode_score: {scores[rows]}")
        if len({groups[r] for r in rows}) != 1:
            raise ValueError(f"trajectory {trajs[rows[0]]!r} spans several group_ids")
        traj_score[k] = scores[rows[0]]
        traj_group.append(groups[rows[0]])

    std_normalize = norm == "mean_std_norm"
    if stats == "steps":  # the population is the rows themselves
        return _normalize_with_scale(scores, _group_rows(groups), std_normalize, eps, singleton)

    traj_adv, traj_scale = _normalize_with_scale(
        traj_score, _group_rows(traj_group), std_normalize, eps, singleton
    )
    adv, scale = np.zeros_like(scores), np.ones_like(scores)
    for k, rows in enumerate(traj_rows):
        adv[rows], scale[rows] = traj_adv[k], traj_scale[k]
    return adv, scale


def _normalize_with_scale(
    values: np.ndarray, groups: list[np.ndarray], std_normalize: bool, eps: float, singleton: Singleton
) -> tuple[np.ndarray, np.ndarray]:
    """group_normalize plus each member's divisor s_g; a "raw" singleton uses mean 0, std 1."""
    adv = group_normalize(values, groups, std_normalize=std_normalize, eps=eps)
    scale = np.ones_like(values)
    for members in groups:
        if len(members) == 1:
            if singleton == "raw":
                scale[members] = 1.0 + eps if std_normalize else 1.0
                adv[members] = values[members] / scale[members]
            continue
        std = values[members].std(ddof=1)
        if std_normalize and std > CONSTANT_STD:
            scale[members] = std + eps
    return adv, scale


@_renamed_keywords(state_hashes="state_keys", mode="norm")
def step_advantages(
    returns: Floats, group_ids: Keys, state_keys: Keys, *, norm: Norm = "mean_norm", eps: float = 1e-6
) -> tuple[np.ndarray, list[np.ndarray]]:
    """GiGPO's step term A_S: normalise G_t inside its anchor-state group.

    Anchor group key = (group_id, state_key): the rows of one group (same seed) that acted in the
    same observed state — including a state one trajectory visits twice. Keying by the group too
    keeps identical grids of different seeds apart (ROLL keys by the state key alone). A row with
    state_key None has no known state and forms its own group.

        A_S = G_t - mean_anchor                       (mean_norm)
        A_S = (G_t - mean_anchor) / (std + eps)       (mean_std_norm, unbiased std)

    Singleton/constant anchor groups give 0. Returns (A_S, the anchor groups' row indices).

    >>> a_s, anchors = step_advantages([0.5, 1.0, 0.0, 0.0], ["g"] * 4, ["s0", "s1", "s0", "s0"])
    >>> a_s.round(4), [a.tolist() for a in anchors]
    (array([ 0.3333,  0.    , -0.1667, -0.1667]), [[0, 2, 3], [1]])
    """
    _check_norm(norm)
    values = _floats("returns", returns)
    groups, states = _keys(group_ids), _keys(state_keys)
    _check_lengths(returns=values, group_ids=groups, state_keys=states)
    anchor_keys = [
        (g, s) if s is not None else (_NO_STATE, row)
        for row, (g, s) in enumerate(zip(groups, states, strict=True))
    ]
    anchors = _group_rows(anchor_keys)
    adv = group_normalize(values, anchors, std_normalize=norm == "mean_std_norm", eps=eps)
    return adv, anchors


@_renamed_keywords(state_hashes="state_keys", mode="norm")
def gigpo(
    episode_scores: Floats,
    step_rewards: Floats,
    group_ids: Keys,
    traj_ids: Keys,
    steps: Floats,
    state_keys: Keys,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm: Norm = "mean_norm",
    invalid_penalty: float = 0.0,
    action_valid: Sequence[bool] | np.ndarray | Any | None = None,
    eps: float = 1e-6,
    episode_stats: EpisodeStats = "episodes",
    singleton: Singleton = "zero",
) -> tuple[np.ndarray, dict[str, float]]:
    """GiGPO (Feng et al. 2025): episode-relative plus anchor-state-relative advantages.

    One row per step (the step manager's samples). For row j = (trajectory i, step t):

      1. G_t = r_t + gamma * G_{t+1} inside trajectory i, no bootstrap   (discounted_returns)
      2. A_E(i): R_i normalised over the EPISODES of i's group            (episode_advantages)
      3. anchor groups: rows with the same (group_id, state_key)
      4. A_S(j): G_t normalised inside its anchor group                   (step_advantages)
      5. A(j) = A_E(i) + step_weight * A_S(j)

    norm "mean_norm" subtracts the mean; "mean_std_norm" also divides by (unbiased std + eps).
    Singleton and constant groups (episode or anchor) contribute 0.

    verl-agent's reference (gigpo/core_gigpo.py, `compute_gigpo_outcome_advantage`) differs in
    two ways, both offered here (see `episode_advantages`): its episode statistics run over step-
    rows (`episode_stats="steps"`), and a singleton episode group passes its raw score through
    (`singleton="raw"`). Its step term already matches: a singleton anchor group has mean = its
    own return, so A_S = 0 there too. With both options (and invalid_penalty=0, exactly
    representable scores) `gigpo` equals that function row for row.

    Invalid-action penalty p (verl-agent; applies to rows with action_valid False, only there):
      - step term: the row's reward and return become r_t - p and G_t - p. The returns are
        discounted first, so the earlier rows' G do not see p; the anchor-group statistics then
        include the penalised G_t (the invalid action ranks below valid ones from the same state).
      - episode term: the row's copy of its episode score becomes R_i - p, normalised with the
        group's statistics over unpenalised episodes: A_E(j) = A_E(i) - p / s_g, s_g = std_g + eps
        in mean_std_norm (1 in mean_norm, and 1 for a singleton or constant group). So the
        penalty reaches the row even when its anchor group is a singleton, and valid rows and
        other trajectories are untouched.

    Returns (advantages, stats); stats (floats) include the mean anchor-group size and the
    fraction of singleton anchor groups (the paper reports < 35% singletons).

    Worked example, gamma = 0.5, one group, trajectory A visits s0 then s1 (rewards 0, 1; R = 1),
    trajectory B stays in s0 twice (rewards 0, 0; R = 0):
      G = [0.5, 1, 0, 0];  A_E = [0.5, 0.5, -0.5, -0.5];
      anchor (g, s0) = rows {0, 2, 3}, mean 1/6 -> A_S = [1/3, 0, -1/6, -1/6] ((g, s1) singleton)
      A = [0.8333, 0.5, -0.6667, -0.6667]

    >>> adv, stats = gigpo([1, 1, 0, 0], [0, 1, 0, 0], ["g"] * 4, ["A", "A", "B", "B"], [0, 1, 0, 1],
    ...                    ["s0", "s1", "s0", "s0"], gamma=0.5)
    >>> adv.round(4)
    array([ 0.8333,  0.5   , -0.6667, -0.6667])
    >>> stats["anchor_group_size_mean"], stats["anchor_singleton_frac"]
    (2.0, 0.5)
    """
    _check_norm(norm)
    n = _check_lengths(
        episode_scores=episode_scores,
        step_rewards=step_rewards,
        group_ids=group_ids,
        traj_ids=traj_ids,
        steps=steps,
        state_keys=state_keys,
    )
    if invalid_penalty != 0.0 and action_valid is None:
        raise ValueError("invalid_penalty needs action_valid (one bool per row)")
    invalid = np.zeros(n, dtype=bool)
    if action_valid is not None:
        valid = np.asarray(action_valid.tolist() if hasattr(action_valid, "tolist") else action_valid)
        _check_lengths(episode_scores=episode_scores, action_valid=valid)
        invalid = ~valid.astype(bool)

    # 1. discounted step returns, then the penalty on the offending rows only (no propagation)
    returns = discounted_returns(step_rewards, traj_ids, steps, gamma=gamma)
    returns = returns - invalid_penalty * invalid

    # 2. episode term, over episodes; the penalty hits the offending row's copy of R
    a_e, scale = episode_advantages(
        episode_scores, group_ids, traj_ids, norm=norm, eps=eps, stats=episode_stats, singleton=singleton
    )
    a_e = a_e - invalid_penalty * invalid / scale

    # 3 + 4. anchor-state groups and the step term
    a_s, anchors = step_advantages(returns, group_ids, state_keys, norm=norm, eps=eps)

    # 5. combine
    adv = a_e + step_weight * a_s

    sizes = np.array([len(a) for a in anchors], dtype=np.float64)
    stats = {
        "anchor_groups": float(len(anchors)),
        "anchor_group_size_mean": float(sizes.mean()) if n else 0.0,
        "anchor_singleton_frac": float((sizes == 1).mean()) if n else 0.0,
        # the share of rows whose step term is 0 for lack of a comparison
        "anchor_singleton_row_frac": float((sizes == 1).sum() / n) if n else 0.0,
        "invalid_frac": float(invalid.mean()) if n else 0.0,
        "step_return_mean": float(returns.mean()) if n else 0.0,
        "episode_adv_abs_mean": float(np.abs(a_e).mean()) if n else 0.0,
        "step_adv_abs_mean": float(np.abs(a_s).mean()) if n else 0.0,
    }
    return adv, stats
