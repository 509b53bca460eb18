"""GiGPO over forked anchor groups: the step term compares K actions sampled in one copied state.

The rollout (`arl.rollout.fork`, whose docstring gives the design, the cost and the reasons) forks
chosen states of a training episode, the trunk: K actions from one prompt, each played in its own
copy of the env. Its rows come in three kinds, told apart by two columns:

    fork_id None                 a trunk step at an unforked state      (GiGPO's row, unchanged)
    fork_id set, branch False    the trunk's own step at a forked state (one of the fork's K rows)
    fork_id set, branch True     a branch's forked action               (the other K - 1 rows)

`fork_rewards` holds each forked row's rewards from its forked state on (its own action's first);
their discounted sum is the fork return F the group compares. `gigpo_forked` is then GiGPO with
two changes, read top to bottom:

  1. G_t = r_t + gamma * G_{t+1} over the trunk rows               (discounted_returns)
  2. F_j = sum_i gamma^i fork_rewards_j[i] on the forked rows       (fork_returns)
  3. A_E: the episode term over the TRUNKS of each group, as GiGPO; branch rows get 0
  4. A_S: forked rows normalise F inside their fork (exactly K rows, keyed by fork_id, never by
     the state key); unforked rows normalise G_t in GiGPO's (group_id, state_key) anchor groups
  5. A = A_E + step_weight * A_S

A batch without forked rows gives exactly `gigpo`'s advantages. The invalid-action penalty p acts
as in `gigpo`: on the offending row's return (G_t or F) and on the episode term of trunk rows.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

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
from arl.algo.step_level import (
    EpisodeStats,
    Norm,
    Singleton,
    _check_norm,
    discounted_returns,
    episode_advantages,
    step_advantages,
)

__all__ = ["fork_returns", "gigpo_forked"]


def fork_returns(fork_rewards: Sequence[Sequence[float]], *, gamma: float) -> np.ndarray:
    """The discounted return of each row's rewards from its forked state: F = sum_i gamma^i r_i.

    No bootstrap at the end (a branch cut at ``fork.horizon`` stops there, as the trunk's own row
    does over the same horizon); a row without rewards has F = 0.

    >>> fork_returns([[0.0, 1.0], [1.0], [0.0, 0.0], []], gamma=0.5)
    array([0.5, 1. , 0. , 0. ])
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out = np.zeros(len(fork_rewards))
    for row, rewards in enumerate(fork_rewards):
        r = _floats("fork_rewards", list(rewards)) if len(rewards) else np.zeros(0)
        out[row] = float(np.sum(r * gamma ** np.arange(len(r))))
    return out


@_renamed_keywords(state_hashes="state_keys", mode="norm")
def gigpo_forked(
    episode_scores: Floats,
    step_rewards: Floats,
    group_ids: Keys,
    traj_ids: Keys,
    steps: Floats,
    state_keys: Keys,
    fork_ids: Sequence[Hashable | None],
    fork_rewards: Sequence[Sequence[float]],
    branch: Sequence[bool] | np.ndarray,
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
    """GiGPO whose step term uses forked anchor groups where the rollout made them (module docstring).

    Columns as in `gigpo`, plus one entry per row of ``fork_ids`` (None: not forked),
    ``fork_rewards`` (read on forked rows only) and ``branch``. A branch row needs a fork id; a
    fork's rows must share one group. Edge cases: a fork group whose returns are all equal gives 0
    (as every constant group); so does a fork of one row (a fork whose other rows were dropped).

    Returns (advantages, stats): `gigpo`'s stats (the anchor-group ones over natural and fork groups
    together; ``episode_adv_abs_mean`` over trunk rows), plus ``fork_groups``,
    ``fork_group_size_mean``, ``fork_row_frac``, ``branch_row_frac``, ``fork_constant_frac`` (fork
    groups with no spread: no signal) and ``fork_adv_abs_mean`` (mean |A_S| on forked rows).

    Worked example, gamma = 0.5, one group. Trunk A forks at s0 (K = 3): its own step there earns 0,
    then 1 at s1 (R = 1, fork rewards [0, 1]); branch A@0.1 earns [0, 0], branch A@0.2 earns [1].
    Trunk B acts once in s0, unforked, and earns 0 (R = 0).
      A_E: trunks A, B -> [+0.5, +0.5, -0.5] on A's rows and B's; branch rows 0
      F at A@0 = [0.5, 0, 1], mean 0.5 -> A_S = [0, -0.5, 0.5]
      A1 at s1 and B0 at s0 are singleton natural anchors (B0 does not join A's fork): A_S = 0
      A = [A0 0.5, A1 0.5, B0 -0.5, A@0.1 -0.5, A@0.2 0.5]

    >>> adv, stats = gigpo_forked(
    ...     [1, 1, 0, 0, 1], [0, 1, 0, 0, 1], ["g"] * 5, ["A", "A", "B", "A@0.1", "A@0.2"], [0, 1, 0, 0, 0],
    ...     ["s0", "s1", "s0", "s0", "s0"], ["A@0", None, None, "A@0", "A@0"],
    ...     [[0, 1], [], [], [0, 0], [1]], [False, False, False, True, True], gamma=0.5)
    >>> adv
    array([ 0.5,  0.5, -0.5, -0.5,  0.5])
    >>> stats["fork_groups"], stats["fork_group_size_mean"], stats["anchor_groups"]
    (1.0, 3.0, 3.0)
    """
    _check_norm(norm)
    n = _check_lengths(
        episode_scores=episode_scores, step_rewards=step_rewards, group_ids=group_ids, traj_ids=traj_ids,
        steps=steps, state_keys=state_keys, fork_ids=fork_ids, fork_rewards=fork_rewards, branch=branch,
    )
    if invalid_penalty != 0.0 and action_valid is None:
        raise ValueError("invalid_penalty needs action_valid (one bool per row)")
    invalid = np.zeros(n, dtype=bool)
    if action_valid is not None:
        valid = np.asarray(action_valid.tolist() if hasattr(action_valid, "tolist") else action_valid)
        _check_lengths(episode_scores=episode_scores, action_valid=valid)
        invalid = ~valid.astype(bool)
    groups, trajs, states, forks = _keys(group_ids), _keys(traj_ids), _keys(state_keys), list(fork_ids)
    is_branch = np.asarray(list(branch), dtype=bool)
    forked = np.array([f is not None for f in forks], dtype=bool)
    if np.any(is_branch & ~forked):
        raise ValueError(f"branch rows {np.flatnonzero(is_branch & ~forked).tolist()} have no fork_id")
    fork_rows = [rows for rows in _group_rows([f if f is not None else ("", row) for row, f in enumerate(forks)])
                 if forked[rows[0]]]
    for rows in fork_rows:
        if len({groups[r] for r in rows}) != 1:
            raise ValueError(f"fork {forks[rows[0]]!r} spans several group_ids")
    trunk, natural = np.flatnonzero(~is_branch), np.flatnonzero(~forked)
    scores, rewards = _floats("episode_scores", episode_scores), _floats("step_rewards", step_rewards)
    step_idx = _floats("steps", steps)

    # 1. + 2. returns: G_t along each trunk, F from each forked row's state; then the penalty
    returns = np.zeros(n)
    returns[trunk] = discounted_returns(rewards[trunk], [trajs[r] for r in trunk], step_idx[trunk], gamma=gamma)
    returns[forked] = fork_returns([fork_rewards[r] for r in np.flatnonzero(forked)], gamma=gamma)
    returns = returns - invalid_penalty * invalid

    # 3. episode term over the trunks; a branch is no episode of its group
    a_e = np.zeros(n)
    if len(trunk):
        a_e[trunk], scale = episode_advantages(
            scores[trunk], [groups[r] for r in trunk], [trajs[r] for r in trunk], norm=norm, eps=eps,
            stats=episode_stats, singleton=singleton,
        )
        a_e[trunk] -= invalid_penalty * invalid[trunk] / scale

    # 4. step term: fork groups where the rollout forked, GiGPO's natural anchors elsewhere
    a_s = np.zeros(n)
    a_s[forked] = group_normalize(returns, fork_rows, std_normalize=norm == "mean_std_norm", eps=eps)[forked]
    natural_anchors: list[np.ndarray] = []
    if len(natural):
        a_s[natural], local = step_advantages(
            returns[natural], [groups[r] for r in natural], [states[r] for r in natural], norm=norm, eps=eps
        )
        natural_anchors = [natural[rows] for rows in local]

    # 5. combine
    adv = a_e + step_weight * a_s

    sizes = np.array([len(a) for a in natural_anchors + fork_rows], dtype=np.float64)
    fork_sizes = np.array([len(rows) for rows in fork_rows], dtype=np.float64)
    spread = [len(rows) > 1 and returns[rows].std(ddof=1) > CONSTANT_STD for rows in fork_rows]
    stats = {
        "anchor_groups": float(len(sizes)),
        "anchor_group_size_mean": float(sizes.mean()) if n else 0.0,
        "anchor_singleton_frac": float((sizes == 1).mean()) if n else 0.0,
        "anchor_singleton_row_frac": float(sizes[sizes == 1].sum() / n) if n else 0.0,
        "invalid_frac": float(invalid.mean()) if n else 0.0,
        "step_return_mean": float(returns.mean()) if n else 0.0,
        "episode_adv_abs_mean": float(np.abs(a_e[trunk]).mean()) if len(trunk) else 0.0,
        "step_adv_abs_mean": float(np.abs(a_s).mean()) if n else 0.0,
        "fork_groups": float(len(fork_rows)),
        "fork_group_size_mean": float(fork_sizes.mean()) if fork_rows else 0.0,
        "fork_row_frac": float(forked.mean()) if n else 0.0,
        "branch_row_frac": float(is_branch.mean()) if n else 0.0,
        "fork_constant_frac": float(1.0 - np.mean(spread)) if fork_rows else 0.0,
        "fork_adv_abs_mean": float(np.abs(a_s[forked]).mean()) if forked.any() else 0.0,
    }
    return adv, stats
