"""ForkEnvManager: anchor groups of exactly K at forked states, one prompt token for token, the
trunk as the step manager plays it, advantages as documented, and uncopyable envs refused at start."""

from __future__ import annotations

import doctest
import sys
import threading
import types
from collections import defaultdict

import attrs
import gymnasium as gym
import numpy as np
import pytest

from arl.algo.estimators import estimate
from arl.config import AlgoConfig, ForkConfig, ManagerConfig, RolloutConfig, load_config
from arl.envs.frozen_lake import FrozenLakeEnv
from arl.rollout import (
    EpisodeSpec,
    ForkEnvManager,
    GroupScheduler,
    NotForkableError,
    StepEnvManager,
    TrajEnvManager,
    rollout_metrics,
)
from arl.rollout import fork as fork_mod
from arl.rollout.factory import check_rollout, make_manager

pytestmark = pytest.mark.anyio

K = 3


def fork_config(**fork) -> ManagerConfig:
    return ManagerConfig(max_tokens=32, history_len=2, fork=ForkConfig(**{"k": K, **fork}))


async def play_groups(engine, config, env_id="arl/FrozenLake-v0", groups=2, size=3, step=0):
    scheduler = GroupScheduler(env_id, num_groups=groups, group_size=size, base_seed=7)
    return await scheduler.run(ForkEnvManager(engine, config), scheduler.specs(step))


def by_fork(samples):
    out = defaultdict(list)
    for s in samples:
        if s.fork_id is not None:
            out[s.fork_id].append(s)
    return out


def test_docstring_examples():
    failures, tried = doctest.testmod(fork_mod)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize("env_id", ["arl/FrozenLake-v0", "arl/FrozenLakeSlippery-v0", "arl/Sokoban-v0"])
async def test_forked_states_are_groups_of_exactly_k_sharing_one_prompt(scripted_engine, env_id):
    scripted_engine.invalid_rate = 0.2
    batch = await play_groups(scripted_engine, fork_config(states=2), env_id)
    forks = by_fork(batch.samples)
    assert forks
    for episode in batch.episodes:
        traj = episode.trajectory
        assert traj.ok, traj.error
        forked_steps = sorted({b.step for b in traj.branches})
        assert forked_steps == list(range(min(2, len(traj.turns))))  # at=first, states=2
        for t in forked_steps:
            rows = forks[f"{traj.traj_id}@{t}"]
            assert len(rows) == K
            trunk = [s for s in rows if not s.branch]
            assert len(trunk) == 1 and trunk[0].traj_id == traj.traj_id and trunk[0].step == t
            prompt = list(traj.turns[t].prompt_ids)
            for s in rows:  # the same prompt, token for token, and the loss on the reply only
                assert s.input_ids[: len(prompt)] == prompt and s.response_mask[: len(prompt)] == [0] * len(prompt)
                assert s.step == t and s.group_id == traj.group_id
                assert s.state_key == trunk[0].state_key == traj.turns[t].state_key
    assert all(len(rows) == K for rows in forks.values())


async def test_the_k_replies_are_one_n_k_request_and_the_trunk_plays_as_the_step_manager(scripted_engine):
    """Completion 0 is the trunk's action, so the trunk is the unforked step episode; the others are
    the request's completions 1..K-1 (the scripted engine answers per prompt, seed and index)."""
    config = fork_config(states=2)
    spec = EpisodeSpec("arl/FrozenLake-v0", 5, "train_0_5", 0)
    forked = await ForkEnvManager(scripted_engine, config).run_episode(spec)
    plain = await StepEnvManager(scripted_engine, ManagerConfig(max_tokens=32, history_len=2)).run_episode(spec)
    assert [t.response_ids for t in forked.trajectory.turns] == [t.response_ids for t in plain.trajectory.turns]
    assert [s.input_ids for s in forked.samples if s.fork_id is None or not s.branch] == [
        s.input_ids for s in plain.samples]
    manager = ForkEnvManager(scripted_engine, config)
    for branch in forked.trajectory.branches:
        first = branch.turns[0]
        gens = await scripted_engine.generate(first.prompt_ids, attrs.evolve(manager.sampling_params(spec, branch.step), n=K))
        assert first.response_ids == gens[branch.index].token_ids
        assert forked.trajectory.turns[branch.step].response_ids == gens[0].token_ids


async def test_branch_rows_train_the_forked_action_only(scripted_engine):
    batch = await play_groups(scripted_engine, fork_config())
    for episode in batch.episodes:
        traj = episode.trajectory
        branch_rows = {s.traj_id: s for s in episode.samples if s.branch}
        assert len(branch_rows) == len(traj.branches) == K - 1  # one row per branch, its playout untrained
        trunk_rows = [s for s in episode.samples if not s.branch]
        assert len(trunk_rows) == len(traj.turns)
        for b in traj.branches:
            s, first = branch_rows[b.traj_id], b.turns[0]
            n_prompt = len(first.prompt_ids)
            assert s.input_ids[n_prompt : n_prompt + len(first.response_ids)] == first.response_ids
            assert sum(s.response_mask) == len(first.response_ids)
            assert s.old_logprobs[n_prompt : n_prompt + len(first.response_ids)] == first.response_logprobs
            assert s.fork_rewards == tuple(b.rewards) and s.step_score == first.reward
            assert s.episode_score == pytest.approx(sum(t.reward for t in traj.turns[: b.step]) + sum(b.rewards))
            assert s.exit_reason == traj.exit_reason
        trunk = trunk_rows[0]
        assert trunk.fork_rewards == tuple(t.reward for t in traj.turns)  # no horizon: to the end


async def test_every_state_and_a_rule(scripted_engine):
    batch = await play_groups(scripted_engine, fork_config(at="every"), groups=1, size=2)
    for episode in batch.episodes:
        traj = episode.trajectory
        assert sorted({b.step for b in traj.branches}) == list(range(len(traj.turns)))
        assert all(b.index in range(1, K) for b in traj.branches)

    rules = types.ModuleType("arl_test_fork_rules")
    rules.odd = lambda step, observation: step % 2 == 1 and "P" in observation
    sys.modules["arl_test_fork_rules"] = rules
    try:
        batch = await play_groups(scripted_engine, fork_config(at="arl_test_fork_rules:odd"), groups=1, size=2)
    finally:
        del sys.modules["arl_test_fork_rules"]
    for episode in batch.episodes:
        assert {b.step for b in episode.trajectory.branches} <= set(range(1, 10, 2))
    with pytest.raises(ValueError, match="cannot load the rule"):
        ForkEnvManager(scripted_engine, fork_config(at="arl_test_no_such_module:rule"))


async def test_horizon_bounds_every_branch_and_the_trunks_own_return(scripted_engine):
    batch = await play_groups(scripted_engine, fork_config(horizon=2, states=3), groups=2, size=2)
    saw_horizon = False
    for episode in batch.episodes:
        traj = episode.trajectory
        for b in traj.branches:
            assert 1 <= len(b.turns) <= 2
            assert b.exit_reason in ("terminated", "truncated", "horizon")
            saw_horizon |= b.exit_reason == "horizon"
        for s in episode.samples:
            if s.fork_id is not None and not s.branch:
                assert s.fork_rewards == tuple(t.reward for t in traj.turns[s.step : s.step + 2])
    assert saw_horizon


async def test_branch_playouts_sample_independently_of_the_trunk(scripted_engine):
    """A branch's playout requests have seeds of their own: two branches that take the same action
    from the same state do not replay each other (or the trunk) token for token."""
    config = fork_config(k=8)
    episode = await ForkEnvManager(scripted_engine, config).run_episode(
        EpisodeSpec("arl/Sokoban-v0", 3, "train_0_3", 0))
    seeds = {fork_mod.branch_seed(config, EpisodeSpec("arl/Sokoban-v0", 3, "train_0_3", 0), b, 1)
             for b in episode.trajectory.branches}
    assert len(seeds) == len(episode.trajectory.branches) == 7


async def test_advantages_are_computed_as_documented(scripted_engine):
    """GiGPO over a forked batch: A_E over the trunks only (branch rows 0); A_S the fork return
    minus its fork's mean on forked rows; GiGPO's natural anchors on the other trunk rows."""
    batch = await play_groups(scripted_engine, fork_config(states=2), groups=2, size=3)
    samples = [s for s in batch.samples if s.num_response_tokens > 0]
    algo = AlgoConfig(gamma=0.5, step_weight=2.0, gigpo_norm="mean_norm")
    adv, stats = estimate("gigpo", samples, algo)

    trunks = {}
    for s in samples:
        if not s.branch:
            trunks[s.traj_id] = (s.group_id, s.episode_score)
    group_mean = defaultdict(list)
    for group, score in trunks.values():
        group_mean[group].append(score)
    forks = by_fork(samples)
    fork_mean = {f: np.mean([sum(r * 0.5**i for i, r in enumerate(s.fork_rewards)) for s in rows])
                 for f, rows in forks.items()}
    natural = defaultdict(list)
    returns = {}
    for traj_id in trunks:
        rows = sorted((s for s in samples if s.traj_id == traj_id), key=lambda s: s.step)
        g = 0.0
        for s in reversed(rows):
            g = s.step_score + 0.5 * g
            returns[(traj_id, s.step)] = g
            if s.fork_id is None:
                natural[(s.group_id, s.state_key)].append(g)
    for s, a in zip(samples, adv, strict=True):
        a_e = 0.0 if s.branch else s.episode_score - np.mean(group_mean[s.group_id])
        if s.fork_id is not None:
            a_s = sum(r * 0.5**i for i, r in enumerate(s.fork_rewards)) - fork_mean[s.fork_id]
        else:
            members = natural[(s.group_id, s.state_key)]
            a_s = returns[(s.traj_id, s.step)] - np.mean(members) if len(members) > 1 else 0.0
        assert a == pytest.approx(a_e + 2.0 * a_s, abs=1e-9)
    assert stats["gigpo_fork_groups"] == len(forks) and stats["gigpo_fork_group_size_mean"] == K


async def test_grpo_and_reinforce_refuse_branch_rows(scripted_engine):
    batch = await play_groups(scripted_engine, fork_config(), groups=1, size=2)
    for name in ("grpo", "reinforce"):
        with pytest.raises(ValueError, match="does not read forked branch rows"):
            estimate(name, batch.samples, AlgoConfig())


async def test_validation_and_warm_start_episodes_do_not_fork(scripted_engine):
    manager = ForkEnvManager(scripted_engine, fork_config())
    for tag in ("val", "sft"):
        episode = await manager.run_episode(EpisodeSpec("arl/FrozenLake-v0", 1, f"{tag}_0_1", 0, tag=tag))
        assert episode.trajectory.branches == [] and not any(s.fork_id for s in episode.samples)
    assert isinstance(manager.derive(ManagerConfig(temperature=0.5)), ForkEnvManager)


async def test_rollout_metrics_count_what_the_branches_cost(scripted_engine):
    batch = await play_groups(scripted_engine, fork_config(), groups=2, size=2)
    branches = [b for e in batch.episodes for b in e.trajectory.branches]
    m = rollout_metrics(batch.episodes)
    assert m["rollout/fork_states"] == 4 and m["rollout/branches"] == 4 * (K - 1) == len(branches)
    assert m["rollout/branch_turns"] == sum(len(b.turns) for b in branches)
    # a forked action shares the fork's request: its reply only; playout turns prompt and reply
    assert m["rollout/branch_tokens"] == sum(len(b.turns[0].response_ids) + sum(
        len(t.prompt_ids) + len(t.response_ids) for t in b.turns[1:]) for b in branches)
    assert m["rollout/num_turns"] == sum(len(e.trajectory.turns) for e in batch.episodes)  # trunks only


class BrittleCopyLake(FrozenLakeEnv):
    """A lake whose forks crash on their second step; the original plays on."""

    copy = False

    def fork(self):
        import copy

        twin = copy.deepcopy(self)
        twin.copy, twin.moves = True, 0
        return twin

    def step(self, action):
        if self.copy:
            self.moves += 1
            if self.moves == 2:
                raise RuntimeError("the copy cracked")
        return super().step(action)


BRITTLE_ID = "arl_test/BrittleCopyLake-v0"
if BRITTLE_ID not in gym.registry:
    gym.register(id=BRITTLE_ID, entry_point=BrittleCopyLake, max_episode_steps=10)


async def test_a_failing_branch_fails_its_episode_with_the_envs_error(scripted_engine):
    """A branch's env error ends the episode as an env error (not arl's internal error: the task
    group's ExceptionGroup is unwrapped), with the cause's text; the trunk's completed steps are
    salvaged without fork rows."""
    manager = ForkEnvManager(scripted_engine, fork_config(at="every"))
    failed = 0
    for seed in range(6):
        episode = await manager.run_episode(EpisodeSpec(BRITTLE_ID, seed, f"train_0_{seed}", 0))
        traj = episode.trajectory
        if traj.ok:  # every branch ended with its first step, before its copy could crack
            assert all(len(b.turns) == 1 for b in traj.branches)
            continue
        failed += 1
        assert (traj.status, traj.exit_reason) == ("Failed", "env_error")
        assert traj.error == "RuntimeError: the copy cracked" and "ExceptionGroup" not in traj.traceback
        assert episode.samples and all(s.fork_id is None and not s.branch for s in episode.samples)
    assert failed


# -- refused at start -----------------------------------------------------------------------------


class LockedLake(FrozenLakeEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.lock = threading.Lock()  # deepcopy cannot copy it


LOCKED_ID = "arl_test/ForkLockedLake-v0"
if LOCKED_ID not in gym.registry:
    gym.register(id=LOCKED_ID, entry_point=LockedLake, max_episode_steps=10)


def test_an_uncopyable_env_is_refused_when_the_manager_is_built(scripted_engine):
    rollout = RolloutConfig(env_id=LOCKED_ID, mode="step", manager=fork_config())
    with pytest.raises(NotForkableError, match="LockedLake cannot be copied"):
        make_manager(scripted_engine, rollout)
    plain = RolloutConfig(env_id=LOCKED_ID, mode="step")
    assert type(make_manager(scripted_engine, plain)) is StepEnvManager  # unforked, it plays


def test_the_config_and_the_other_managers_refuse_what_would_not_fork(scripted_engine, tmp_path):
    manager = make_manager(scripted_engine, RolloutConfig(mode="step", manager=fork_config()))
    assert type(manager) is ForkEnvManager
    assert check_rollout(scripted_engine.tokenizer, None, manager) is not None  # checked as the step setting
    with pytest.raises(ValueError, match="does not fork states"):
        StepEnvManager(scripted_engine, fork_config())
    with pytest.raises(ValueError, match="does not fork states"):
        TrajEnvManager(scripted_engine, fork_config())
    with pytest.raises(ValueError, match="k >= 2"):
        ForkConfig(k=1)
    with pytest.raises(ValueError, match="fork.at='sometimes'"):
        ForkConfig(k=2, at="sometimes")
    with pytest.raises(ValueError, match="needs rollout.mode=step"):
        RolloutConfig(mode="traj", manager=fork_config())
    with pytest.raises(ValueError, match="use gigpo"):
        load_config(None, ["rollout.manager.fork.k=4", "algo.estimator=grpo"])
    config = load_config(None, ["rollout.manager.fork={k: 4, at: every, horizon: 3}"])
    assert config.rollout.manager.fork == ForkConfig(k=4, at="every", horizon=3)
