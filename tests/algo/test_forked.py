"""gigpo_forked: GiGPO whose forked states are anchor groups of their own (arl.rollout.fork's rows)."""

from __future__ import annotations

import doctest
import math
import types

import numpy as np
import pytest

from arl.algo import forked as forked_mod
from arl.algo import gigpo, gigpo_forked
from arl.algo.estimators import estimate
from arl.algo.forked import fork_returns


def test_docstring_examples():
    failures, tried = doctest.testmod(forked_mod)
    assert tried > 0 and failures == 0


def random_batch(rng, groups=3, members=3, max_len=5):
    rows = {k: [] for k in ("scores", "rewards", "groups", "trajs", "steps", "states", "valid")}
    for g in range(groups):
        for m in range(members):
            length = int(rng.integers(1, max_len + 1))
            rewards = rng.choice([0.0, 0.0, 1.0, -0.1], size=length)
            for t in range(length):
                rows["scores"].append(float(rewards.sum()))
                rows["rewards"].append(float(rewards[t]))
                rows["groups"].append(f"g{g}")
                rows["trajs"].append(f"g{g}/{m}")
                rows["steps"].append(t)
                rows["states"].append(f"s{int(rng.integers(0, 3))}")
                rows["valid"].append(bool(rng.random() > 0.2))
    return rows


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("norm", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("options", [{}, {"invalid_penalty": 0.1}, {"episode_stats": "steps", "singleton": "raw"}])
def test_without_forks_it_is_gigpo_exactly(seed, norm, options):
    b = random_batch(np.random.default_rng(seed))
    n = len(b["scores"])
    columns = (b["scores"], b["rewards"], b["groups"], b["trajs"], b["steps"], b["states"])
    kwargs = dict(gamma=0.9, step_weight=2.5, norm=norm, action_valid=b["valid"], **options)
    want, want_stats = gigpo(*columns, **kwargs)
    got, stats = gigpo_forked(*columns, [None] * n, [()] * n, [False] * n, **kwargs)
    np.testing.assert_array_equal(got, want)
    assert {k: stats[k] for k in want_stats} == pytest.approx(want_stats)
    assert stats["fork_groups"] == 0 and stats["branch_row_frac"] == 0


def test_mean_std_norm_fork_group_by_hand():
    # one trunk A (a single step at s0, reward 1) forked K = 4; branches earn 0, 0, 1 (gamma 1)
    adv, stats = gigpo_forked(
        [1, 0, 0, 1], [1, 0, 0, 1], ["g"] * 4, ["A", "A@0.1", "A@0.2", "A@0.3"], [0] * 4, ["s0"] * 4,
        ["A@0"] * 4, [[1], [0], [0], [1]], [False, True, True, True], gamma=1.0, norm="mean_std_norm")
    std = math.sqrt(1 / 3)  # [1, 0, 0, 1]: mean 1/2, unbiased std sqrt(1/3)
    np.testing.assert_allclose(adv, np.array([0.5, -0.5, -0.5, 0.5]) / (std + 1e-6), rtol=1e-12)
    assert stats["fork_constant_frac"] == 0 and stats["episode_adv_abs_mean"] == 0  # one trunk: A_E = 0


def test_a_constant_fork_gives_no_step_term_and_branch_rows_no_episode_term():
    # trunks A (R = 1) and B (R = 0); A forks at step 0 and every branch returns what A's step did
    adv, stats = gigpo_forked(
        [1, 0, 1, 1], [1, 0, 1, 1], ["g"] * 4, ["A", "B", "A@0.1", "A@0.2"], [0] * 4, ["s0"] * 4,
        ["A@0", None, "A@0", "A@0"], [[1], [], [1], [1]], [False, False, True, True], gamma=0.5)
    np.testing.assert_array_equal(adv, [0.5, -0.5, 0.0, 0.0])
    assert stats["fork_constant_frac"] == 1 and stats["anchor_singleton_frac"] == 0.5  # B's natural anchor


def test_the_invalid_penalty_reaches_a_branch_row_through_its_return():
    valid = [True, True, False]
    adv, _ = gigpo_forked(
        [0, 0, 0], [0, 0, 0], ["g"] * 3, ["A", "A@0.1", "A@0.2"], [0] * 3, ["s0"] * 3, ["A@0"] * 3,
        [[0], [0], [0]], [False, True, True], gamma=1.0, invalid_penalty=0.3, action_valid=valid)
    np.testing.assert_allclose(adv, [0.1, 0.1, -0.2])  # returns [0, 0, -0.3], mean -0.1


def test_forked_rows_are_checked():
    common = (["g", "g"], ["A", "A@0.1"], [0, 0], ["s", "s"])
    with pytest.raises(ValueError, match="have no fork_id"):
        gigpo_forked([0, 0], [0, 0], *common, [None, None], [(), ()], [False, True])
    with pytest.raises(ValueError, match="spans several group_ids"):
        gigpo_forked([0, 0], [0, 0], ["g", "h"], ["A", "A@0.1"], [0, 0], ["s", "s"], ["f", "f"], [[0], [0]],
                     [False, True])
    with pytest.raises(ValueError, match="one entry per sample"):
        gigpo_forked([0, 0], [0, 0], *common, ["f"], [[0], [0]], [False, True])
    with pytest.raises(ValueError, match="gamma"):
        fork_returns([[1.0]], gamma=1.5)
    with pytest.raises(ValueError, match="non-finite"):
        fork_returns([[float("nan")]], gamma=0.5)


def test_the_gigpo_estimator_reads_forked_rows():
    S = types.SimpleNamespace
    rows = [S(episode_score=1.0, step_score=0.0, group_id="g", traj_id="A", step=0, state_key="s0",
              action_valid=True, fork_id="A@0", fork_rewards=(0.0, 1.0), branch=False),
            S(episode_score=1.0, step_score=1.0, group_id="g", traj_id="A", step=1, state_key="s1",
              action_valid=True, fork_id=None, fork_rewards=(), branch=False),
            S(episode_score=0.0, step_score=0.0, group_id="g", traj_id="A@0.1", step=0, state_key="s0",
              action_valid=True, fork_id="A@0", fork_rewards=(0.0,), branch=True)]
    settings = S(gamma=0.5, step_weight=1.0, gigpo_norm="mean_norm", invalid_penalty=0.0)
    adv, stats = estimate("gigpo", rows, settings)
    np.testing.assert_allclose(adv, [0.25, 0.0, -0.25])  # F = [0.5, 0]: mean 0.25
    assert stats["gigpo_fork_groups"] == 1 and stats["gigpo_branch_row_frac"] == pytest.approx(1 / 3)
