"""Advantage estimators: hand-computed vectors for every edge case, then properties."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arl.algo import _groups, step_level
from arl.algo import advantages as adv_mod
from arl.algo.advantages import (
    discounted_returns,
    episode_advantages,
    gigpo,
    grpo,
    reinforce,
    step_advantages,
)

EPS = 1e-6


# doctest.testmod only runs the examples of functions *defined* in a module, not re-exported
# ones, so each module that defines estimators is listed here.
@pytest.mark.parametrize("module", [adv_mod, step_level, _groups], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


# ---------------------------------------------------------------------------------------- grpo


def test_grpo_hand_vector():
    # group a = [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3); group b = [2, 4]: mean 3, std sqrt(2)
    a = grpo([1.0, 0.0, 0.0, 2.0, 4.0], ["a", "a", "a", "b", "b"])
    s_a, s_b = math.sqrt(1 / 3), math.sqrt(2)
    expected = [
        (2 / 3) / (s_a + EPS),
        (-1 / 3) / (s_a + EPS),
        (-1 / 3) / (s_a + EPS),
        -1 / (s_b + EPS),
        1 / (s_b + EPS),
    ]
    np.testing.assert_allclose(a, expected, rtol=1e-12)


def test_grpo_uses_unbiased_std():
    # [0, 1]: population std 0.5 would give +-1; unbiased std sqrt(1/2) gives +-0.7071
    np.testing.assert_allclose(
        grpo([0.0, 1.0], [7, 7]), [-0.5 / (math.sqrt(0.5) + EPS), 0.5 / (math.sqrt(0.5) + EPS)]
    )


def test_grpo_singleton_and_constant_groups_are_zero():
    a = grpo([5.0, 0.1, 0.1, 0.1, 1.0, 3.0], ["solo", "c", "c", "c", "x", "x"])
    assert a[0] == 0.0  # singleton: exactly 0 (ROLL), not R passed through (verl-agent)
    assert np.all(a[1:4] == 0.0)  # constant: exactly 0 even where 0.1*3/3 != 0.1 in floats
    assert a[4] < 0 < a[5]
    assert np.all(grpo([0.1, 0.1, 0.1], [0, 0, 0], std_normalize=False) == 0.0)


def test_grpo_without_std():
    np.testing.assert_allclose(
        grpo([1.0, 0.0, 0.0, 5.0], ["a", "a", "a", "b"], std_normalize=False), [2 / 3, -1 / 3, -1 / 3, 0.0]
    )


def test_grpo_step_rows_pool_over_rows():
    # verl-agent step level: every step-row carries its episode score; trajectory A has 3 rows
    # (R=1), B has 1 row (R=0): pooled mean 3/4, unbiased std 0.5
    a = grpo([1.0, 1.0, 1.0, 0.0], ["g"] * 4)
    np.testing.assert_allclose(a, [0.25 / (0.5 + EPS)] * 3 + [-0.75 / (0.5 + EPS)])


def test_grpo_whiten_and_clip():
    raw = grpo([1.0, 0.0, 3.0, 1.0, 9.0], ["a", "a", "b", "b", "solo"], std_normalize=False)
    np.testing.assert_allclose(raw, [0.5, -0.5, 1.0, -1.0, 0.0])
    white = grpo([1.0, 0.0, 3.0, 1.0, 9.0], ["a", "a", "b", "b", "solo"], std_normalize=False, whiten=True)
    std = np.std(raw, ddof=1)
    np.testing.assert_allclose(white, raw / (std + EPS))  # raw already has mean 0
    clipped = grpo([1.0, 0.0, 3.0, 1.0, 9.0], ["a", "a", "b", "b", "solo"], std_normalize=False, clip=0.6)
    np.testing.assert_allclose(clipped, [0.5, -0.5, 0.6, -0.6, 0.0])
    # whitening a batch with no signal stays 0
    assert np.all(grpo([1.0, 1.0], [0, 0], whiten=True) == 0.0)
    assert np.all(grpo([1.0], [0], whiten=True) == 0.0)


def test_grpo_accepts_torch_and_numpy():
    scores, groups = torch.tensor([1.0, 0.0, 2.0, 2.0]), torch.tensor([0, 0, 1, 1])
    np.testing.assert_allclose(grpo(scores, groups), grpo([1.0, 0.0, 2.0, 2.0], [0, 0, 1, 1]))
    np.testing.assert_allclose(grpo(np.array([1.0, 0.0]), np.array(["a", "a"])), grpo([1.0, 0.0], ["a", "a"]))


def test_grpo_validation():
    with pytest.raises(ValueError, match="lengths"):
        grpo([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="non-finite"):
        grpo([1.0, float("nan")], ["a", "a"])
    with pytest.raises(ValueError, match="1-D"):
        grpo([[1.0, 2.0]], ["a"])
    with pytest.raises(ValueError, match="clip"):
        grpo([1.0], ["a"], clip=0.0)


def test_reinforce_is_the_score():
    np.testing.assert_array_equal(reinforce([1.0, -0.5, 0.0]), [1.0, -0.5, 0.0])
    np.testing.assert_array_equal(reinforce(torch.tensor([2.0])), [2.0])


# ------------------------------------------------------------------------------ step returns


def test_discounted_returns_gamma():
    # trajectory T: rewards 1, 0, 2 at steps 0, 1, 2 given out of order; gamma 0.9
    g = discounted_returns([2.0, 1.0, 0.0, 5.0], ["T", "T", "T", "U"], [2, 0, 1, 0], gamma=0.9)
    np.testing.assert_allclose(g, [2.0, 1.0 + 0.9 * 0.0 + 0.81 * 2.0, 0.9 * 2.0, 5.0])


def test_discounted_returns_edges():
    np.testing.assert_allclose(discounted_returns([1.0, 1.0], ["T", "T"], [0, 1], gamma=0.0), [1.0, 1.0])
    np.testing.assert_allclose(discounted_returns([1.0, 1.0], ["T", "T"], [0, 1], gamma=1.0), [2.0, 1.0])
    with pytest.raises(ValueError, match="same step"):
        discounted_returns([1.0, 1.0], ["T", "T"], [3, 3], gamma=0.9)
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns([1.0], ["T"], [0], gamma=1.5)


# ---------------------------------------------------------------------------------------- gigpo

# The docstring example: one group, gamma 0.5. A: s0 -> s1 with rewards 0, 1 (R = 1);
# B: s0 -> s0 with rewards 0, 0 (R = 0), so B visits s0 twice.
EX = dict(
    episode_scores=[1.0, 1.0, 0.0, 0.0],
    step_rewards=[0.0, 1.0, 0.0, 0.0],
    group_ids=["g"] * 4,
    traj_ids=["A", "A", "B", "B"],
    steps=[0, 1, 0, 1],
    state_keys=["s0", "s1", "s0", "s0"],
)


def test_gigpo_mean_norm_hand_vector():
    a, stats = gigpo(**EX, gamma=0.5)
    # G = [0.5, 1, 0, 0]; A_E = +-0.5; anchor (g, s0) = rows 0, 2, 3 with mean 1/6
    np.testing.assert_allclose(a, [0.5 + 1 / 3, 0.5 + 0.0, -0.5 - 1 / 6, -0.5 - 1 / 6])
    assert stats["anchor_groups"] == 2.0
    assert stats["anchor_group_size_mean"] == 2.0
    assert stats["anchor_singleton_frac"] == 0.5
    assert stats["anchor_singleton_row_frac"] == 0.25
    assert stats["invalid_frac"] == 0.0


def test_gigpo_mean_std_norm_hand_vector():
    a, _ = gigpo(**EX, gamma=0.5, norm="mean_std_norm")
    # episodes [1, 0]: std sqrt(1/2); anchor s0 returns [0.5, 0, 0]: std sqrt(1/12)
    a_e = 0.5 / (math.sqrt(0.5) + EPS)
    s = math.sqrt(1 / 12) + EPS
    np.testing.assert_allclose(a, [a_e + (1 / 3) / s, a_e, -a_e - (1 / 6) / s, -a_e - (1 / 6) / s])


def test_gigpo_step_weight():
    a, _ = gigpo(**EX, gamma=0.5, step_weight=0.5)
    np.testing.assert_allclose(a, [0.5 + 1 / 6, 0.5, -0.5 - 1 / 12, -0.5 - 1 / 12])
    a0, _ = gigpo(**EX, gamma=0.5, step_weight=0.0)
    np.testing.assert_allclose(a0, [0.5, 0.5, -0.5, -0.5])


def test_gigpo_episode_term_counts_episodes_not_rows():
    # A has 3 rows (R=1), B one row (R=0): per-episode mean is 0.5, not the row-pooled 0.75
    a, _ = gigpo(
        [1.0, 1.0, 1.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
        ["g"] * 4,
        ["A", "A", "A", "B"],
        [0, 1, 2, 0],
        ["x", "y", "z", "w"],
    )
    np.testing.assert_allclose(a, [0.5, 0.5, 0.5, -0.5])  # all anchors singletons -> A_S = 0


def test_gigpo_repeated_state_in_one_trajectory():
    # one trajectory alone in its group, looping on s: A_E = 0 (singleton group), but its two
    # visits of s form an anchor group; gamma 1: G = [0 + 1, 1] -> constant -> 0. With rewards
    # [1, 0] and gamma 0.5: G = [1, 0], mean 0.5 -> A_S = +-0.5
    a, stats = gigpo([1.0, 1.0], [1.0, 0.0], ["g", "g"], ["T", "T"], [0, 1], ["s", "s"], gamma=0.5)
    np.testing.assert_allclose(a, [0.5, -0.5])
    assert stats["anchor_groups"] == 1.0 and stats["anchor_singleton_frac"] == 0.0


def test_gigpo_singleton_groups_are_zero():
    # one trajectory, distinct states: every group is a singleton
    a, stats = gigpo([3.0, 3.0], [1.0, 2.0], ["g", "g"], ["T", "T"], [0, 1], ["a", "b"], norm="mean_std_norm")
    np.testing.assert_array_equal(a, [0.0, 0.0])
    assert stats["anchor_singleton_frac"] == 1.0


def test_gigpo_constant_groups_are_zero():
    # two trajectories with the same score and the same returns from the same state
    a, _ = gigpo(
        [0.1] * 4,
        [0.1, 0.0, 0.1, 0.0],
        ["g"] * 4,
        ["A", "A", "B", "B"],
        [0, 1, 0, 1],
        ["s", "t", "s", "t"],
        norm="mean_std_norm",
    )
    np.testing.assert_array_equal(a, [0.0] * 4)


def test_gigpo_anchor_key_includes_group():
    # the same grid "s" in two different groups (different seeds) must not be pooled
    a, stats = gigpo([1.0, 0.0], [1.0, 0.0], ["g1", "g2"], ["A", "B"], [0, 0], ["s", "s"])
    np.testing.assert_array_equal(a, [0.0, 0.0])
    assert stats["anchor_groups"] == 2.0


def test_gigpo_missing_state_key_is_its_own_anchor():
    a, stats = gigpo([1.0, 0.0], [1.0, 0.0], ["g", "g"], ["A", "B"], [0, 0], [None, None])
    np.testing.assert_allclose(a, [0.5, -0.5])  # only the episode term
    assert stats["anchor_groups"] == 2.0


def test_gigpo_invalid_penalty_mean_norm():
    # EX with B's second action (row 3) invalid, p = 0.1:
    #   G_B1 = 0 - 0.1; G_B0 stays 0 (penalty not discounted backwards)
    #   anchor s0 returns [0.5, 0, -0.1]: mean 0.4/3
    #   A_E row 3 = -0.5 - 0.1
    a, stats = gigpo(**EX, gamma=0.5, invalid_penalty=0.1, action_valid=[True, True, True, False])
    m = 0.4 / 3
    np.testing.assert_allclose(a, [0.5 + 0.5 - m, 0.5, -0.5 - m, -0.6 + (-0.1 - m)])
    assert stats["invalid_frac"] == 0.25


def test_gigpo_invalid_penalty_mean_std_norm():
    a, _ = gigpo(
        **EX, gamma=0.5, norm="mean_std_norm", invalid_penalty=0.1, action_valid=[True, True, True, False]
    )
    s_e = math.sqrt(0.5) + EPS
    g = np.array([0.5, 0.0, -0.1])
    a_s = (g - g.mean()) / (g.std(ddof=1) + EPS)
    a_e = 0.5 / s_e
    np.testing.assert_allclose(a, [a_e + a_s[0], a_e, -a_e + a_s[1], -a_e - 0.1 / s_e + a_s[2]])


def test_gigpo_invalid_penalty_reaches_singletons():
    # alone in its group and its state: only the penalty is left, at scale 1
    a, _ = gigpo(
        [0.0, 0.0],
        [0.0, 0.0],
        ["g", "g"],
        ["T", "T"],
        [0, 1],
        ["a", "b"],
        norm="mean_std_norm",
        invalid_penalty=0.1,
        action_valid=[False, True],
    )
    np.testing.assert_allclose(a, [-0.1, 0.0])


def test_gigpo_validation():
    with pytest.raises(ValueError, match="unknown norm"):
        gigpo(**EX, norm="std")
    with pytest.raises(ValueError, match="lengths"):
        gigpo(**{**EX, "steps": [0, 1, 0]})
    with pytest.raises(ValueError, match="action_valid"):
        gigpo(**EX, invalid_penalty=0.1)
    with pytest.raises(ValueError, match="lengths"):
        gigpo(**EX, action_valid=[True])
    with pytest.raises(ValueError, match="disagree"):
        gigpo(**{**EX, "episode_scores": [1.0, 0.0, 0.0, 0.0]})
    with pytest.raises(ValueError, match="group_ids"):
        gigpo(**{**EX, "group_ids": ["g", "h", "g", "g"]})
    with pytest.raises(ValueError, match="same step"):
        gigpo(**{**EX, "steps": [0, 0, 0, 1]})


def test_gigpo_accepts_collate_like_inputs():
    a_list, _ = gigpo(**EX, gamma=0.5)
    a_t, _ = gigpo(
        torch.tensor(EX["episode_scores"]),
        torch.tensor(EX["step_rewards"]),
        EX["group_ids"],
        EX["traj_ids"],
        torch.tensor(EX["steps"]),
        EX["state_keys"],
        gamma=0.5,
    )
    np.testing.assert_allclose(a_t, a_list, atol=1e-7)


# ---------------------------------------------------------------------------------- properties


@st.composite
def step_batches(draw):
    """Random step-level batches: groups of trajectories of 1-4 steps over a few shared states."""
    rows = []
    for g in range(draw(st.integers(1, 3))):
        for t in range(draw(st.integers(1, 3))):
            score = draw(st.sampled_from([0.0, 1.0, -0.5, 2.0]))
            for step in range(draw(st.integers(1, 4))):
                rows.append(
                    dict(
                        episode_score=score,
                        reward=draw(st.sampled_from([0.0, -0.1, 1.0])),
                        group=f"g{g}",
                        traj=f"g{g}/{t}",
                        step=step,
                        state=draw(st.sampled_from(["a", "b", "c"])),
                        valid=draw(st.booleans()),
                    )
                )
    perm = draw(st.permutations(range(len(rows))))
    return rows, list(perm)


def _gigpo_rows(rows, **kw):
    return gigpo(
        [r["episode_score"] for r in rows],
        [r["reward"] for r in rows],
        [r["group"] for r in rows],
        [r["traj"] for r in rows],
        [r["step"] for r in rows],
        [r["state"] for r in rows],
        action_valid=[r["valid"] for r in rows],
        **kw,
    )


@settings(max_examples=60, deadline=None)
@given(batch=step_batches(), norm=st.sampled_from(["mean_norm", "mean_std_norm"]))
def test_gigpo_permutation_invariant_and_finite(batch, norm):
    rows, perm = batch
    a, stats = _gigpo_rows(rows, norm=norm, invalid_penalty=0.1)
    a_perm, stats_perm = _gigpo_rows([rows[i] for i in perm], norm=norm, invalid_penalty=0.1)
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a_perm, a[perm], atol=1e-9)
    assert stats == pytest.approx(stats_perm)


@settings(max_examples=60, deadline=None)
@given(batch=step_batches())
def test_gigpo_mean_norm_terms_are_zero_mean_in_their_groups(batch):
    rows, _ = batch
    groups = [r["group"] for r in rows]
    trajs = [r["traj"] for r in rows]
    a_e, _ = episode_advantages([r["episode_score"] for r in rows], groups, trajs)
    for g in set(groups):  # one value per trajectory
        per_traj = {t: a_e[i] for i, t in enumerate(trajs) if groups[i] == g}
        assert abs(sum(per_traj.values())) < 1e-9
    returns = discounted_returns([r["reward"] for r in rows], trajs, [r["step"] for r in rows], gamma=0.95)
    a_s, anchors = step_advantages(returns, groups, [r["state"] for r in rows])
    for members in anchors:
        assert abs(a_s[members].sum()) < 1e-9
    # and gigpo is exactly their sum
    a, _ = gigpo(
        [r["episode_score"] for r in rows],
        [r["reward"] for r in rows],
        groups,
        trajs,
        [r["step"] for r in rows],
        [r["state"] for r in rows],
    )
    np.testing.assert_allclose(a, a_e + a_s, atol=1e-12)


@settings(max_examples=80, deadline=None)
@given(
    scores=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=24),
    data=st.data(),
    std_normalize=st.booleans(),
)
def test_grpo_properties(scores, data, std_normalize):
    groups = data.draw(st.lists(st.integers(0, 3), min_size=len(scores), max_size=len(scores)))
    perm = data.draw(st.permutations(range(len(scores))))
    a = grpo(scores, groups, std_normalize=std_normalize)
    assert np.all(np.isfinite(a))
    a_perm = grpo([scores[i] for i in perm], [groups[i] for i in perm], std_normalize=std_normalize)
    np.testing.assert_allclose(a_perm, a[perm], atol=1e-9)
    for g in set(groups):
        members = [i for i, x in enumerate(groups) if x == g]
        assert abs(a[members].sum()) < 1e-6 * max(1, len(members))


def test_algo_imports_nothing_of_arl_but_itself():
    """docs/architecture.md §2: algo imports nothing but torch/numpy (static check; `import arl` loads envs)."""
    import ast
    import pathlib

    for path in pathlib.Path(adv_mod.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else ["arl.algo"]
            for name in names:
                assert not name.startswith("arl") or name.startswith("arl.algo"), (
                    f"{path.name} imports {name}"
                )
