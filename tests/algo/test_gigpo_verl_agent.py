"""GiGPO's verl-agent options (`episode_stats="steps"`, `singleton="raw"`) against the reference.

`_reference` restates, in a few lines of torch, the formulas of verl-agent's gigpo/core_gigpo.py
(`episode_norm_reward` with `compute_mean_std_cross_steps`, `build_step_group`, `step_norm_reward`,
`compute_gigpo_outcome_advantage`; github.com/langfengQ/verl-agent): per row, not per token, since
those functions broadcast one scalar per row over its response mask. Step rewards are the
discounted returns verl-agent feeds in (`compute_step_discounted_returns`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from arl.algo.advantages import discounted_returns, episode_advantages, gigpo


def _stats(values):
    """A population's (mean, std) as verl-agent takes them: a singleton gets (0, 1) in the
    episode term; torch.std is the unbiased std."""
    if len(values) == 1:
        return None
    return torch.mean(torch.tensor(values)), torch.std(torch.tensor([values]))


def _normalise(x, mean, std, remove_std, eps):
    return x - mean if remove_std else (x - mean) / (std + eps)


def _reference(scores, returns, index, traj_index, anchor_obs, *, mode, cross_steps, w=1.0, eps=1e-6):
    """verl-agent's GiGPO advantage of each step-row (one scalar per row). ``mode`` keeps verl-agent's
    name (``algorithm.gigpo.mode``) for what arl calls GiGPO's norm."""
    remove_std = mode == "mean_norm"
    n = len(scores)
    # episode_norm_reward: each row adds its score to its group's population, once per
    # trajectory unless compute_mean_std_cross_steps
    population, seen = defaultdict(list), set()
    for i in range(n):
        if (index[i], traj_index[i]) in seen:
            continue
        population[index[i]].append(scores[i])
        if not cross_steps:
            seen.add((index[i], traj_index[i]))
    episode = np.zeros(n)
    for i in range(n):
        stats = _stats(population[index[i]])
        mean, std = stats if stats is not None else (torch.tensor(0.0), torch.tensor(1.0))
        episode[i] = _normalise(torch.tensor(float(scores[i])), mean, std, remove_std, eps)
    # build_step_group + step_norm_reward: identical observations inside one index group; a
    # singleton anchor group has mean = its own value and std 1
    anchors = defaultdict(list)
    for i in range(n):
        anchors[(index[i], anchor_obs[i])].append(float(returns[i]))
    step = np.zeros(n)
    for i in range(n):
        members = anchors[(index[i], anchor_obs[i])]
        stats = _stats(members)
        mean, std = stats if stats is not None else (torch.tensor(members[0]), torch.tensor(1.0))
        step[i] = _normalise(torch.tensor(float(returns[i])), mean, std, remove_std, eps)
    return episode + w * step


# Two groups. "g": episode A (3 steps, R=1), B (1 step, R=0), C (2 steps, R=0.5).
# "h": a single one-step episode D (R=2): a singleton episode group.
BATCH = dict(
    scores=[1, 1, 1, 0, 0.5, 0.5, 2],
    rewards=[0, 0, 1, 0, 0, 0.5, 2],
    groups=["g", "g", "g", "g", "g", "g", "h"],
    trajs=["A", "A", "A", "B", "C", "C", "D"],
    steps=[0, 1, 2, 0, 0, 1, 0],
    states=["s0", "s1", "s2", "s0", "s0", "s1", "t0"],
)


@pytest.mark.parametrize("norm", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("cross_steps", [True, False])
def test_gigpo_matches_verl_agent_reference(norm, cross_steps):
    b = BATCH
    returns = discounted_returns(b["rewards"], b["trajs"], b["steps"], gamma=0.95)
    expected = _reference(b["scores"], returns, b["groups"], b["trajs"], b["states"], mode=norm, cross_steps=cross_steps)
    adv, _ = gigpo(
        b["scores"], b["rewards"], b["groups"], b["trajs"], b["steps"], b["states"],
        gamma=0.95, norm=norm, episode_stats="steps" if cross_steps else "episodes", singleton="raw",
    )
    np.testing.assert_allclose(adv, expected, rtol=1e-6, atol=1e-6)


def test_episode_term_by_hand():
    """Group g over step-rows: [1,1,1,0,0.5,0.5], mean 2/3; over episodes: [1,0,0.5], mean 1/2."""
    b = BATCH
    rows, _ = episode_advantages(b["scores"], b["groups"], b["trajs"], stats="steps", singleton="raw")
    np.testing.assert_allclose(rows, [1 / 3, 1 / 3, 1 / 3, -2 / 3, -1 / 6, -1 / 6, 2.0])
    eps_, _ = episode_advantages(b["scores"], b["groups"], b["trajs"])
    np.testing.assert_allclose(eps_, [0.5, 0.5, 0.5, -0.5, 0.0, 0.0, 0.0])  # arl: the singleton gives 0


def test_singleton_raw_in_mean_std_norm_divides_by_one_plus_eps():
    adv, scale = episode_advantages([2.0], ["h"], ["D"], norm="mean_std_norm", singleton="raw", eps=1e-3)
    assert adv[0] == pytest.approx(2.0 / 1.001) and scale[0] == pytest.approx(1.001)


def test_steps_pooling_one_episode_of_several_steps_is_constant_not_singleton():
    """verl-agent pools rows: a lone 2-step episode has 2 rows of one score -> mean = R -> 0."""
    adv, _ = episode_advantages([3.0, 3.0], ["g", "g"], ["A", "A"], stats="steps", singleton="raw")
    np.testing.assert_array_equal(adv, [0.0, 0.0])
    adv, _ = episode_advantages([3.0, 3.0], ["g", "g"], ["A", "A"], stats="episodes", singleton="raw")
    np.testing.assert_array_equal(adv, [3.0, 3.0])


def test_defaults_unchanged_and_bad_options_refused():
    b = BATCH
    args = (b["scores"], b["rewards"], b["groups"], b["trajs"], b["steps"], b["states"])
    default, _ = gigpo(*args)
    explicit, _ = gigpo(*args, episode_stats="episodes", singleton="zero")
    np.testing.assert_array_equal(default, explicit)
    # ... and on this batch they differ from verl-agent's reference (the options are not no-ops)
    returns = discounted_returns(b["rewards"], b["trajs"], b["steps"], gamma=0.95)
    reference = _reference(b["scores"], returns, b["groups"], b["trajs"], b["states"], mode="mean_norm", cross_steps=True)
    assert not np.allclose(default, reference)
    with pytest.raises(ValueError, match="stats"):
        gigpo(*args, episode_stats="rows")
    with pytest.raises(ValueError, match="singleton"):
        gigpo(*args, singleton="keep")
