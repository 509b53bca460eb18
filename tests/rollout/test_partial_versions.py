"""Partial rollouts (arl/rollout/partial.py): the policy version of every token. An episode carried
across updates trains as one sample whose tokens hold the version that sampled each of them; the age
metrics, the tokens per version and ``max_age`` read those versions, not the step a group was launched in."""

from __future__ import annotations

import asyncio

import pytest

from arl.config import ManagerConfig
from arl.engine.tokens import TokenRow
from arl.rollout import TrajEnvManager
from arl.rollout.partial import PartialScheduler
from arl.rollout.records import EpisodeSpec, Sample, Trajectory
from tests.rollout.test_partial import _scripted, _until

pytestmark = pytest.mark.anyio


class HeldAt(TrajEnvManager):
    """Episode ``(group serial, member)`` waits after its env step number n (1, 2, ...) until the
    event ``hold[key, n]`` is set; ``late`` groups (by serial) start only once ``start[serial]`` is set.
    Every trajectory is kept."""

    def __init__(self, *args, hold=(), late=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.hold = {key: asyncio.Event() for key in hold}
        self.start = {serial: asyncio.Event() for serial in late}
        self.trajs = {}

    async def run_episode(self, spec):
        serial = int(spec.group_id.split("_")[1])
        if serial in self.start:
            await self.start[serial].wait()
        return await super().run_episode(spec)

    async def act(self, spec, traj, env, prompt_ids, observation):
        key = (int(spec.group_id.split("_")[1]), spec.episode_id)
        self.trajs[key] = traj
        out = await super().act(spec, traj, env, prompt_ids, observation)
        event = self.hold.get((key, len(traj.turns)))  # the turn just played is recorded
        if event is not None:
            await event.wait()
        return out


async def test_an_episode_carried_across_two_updates_trains_each_token_with_its_version(tiny_path):
    """Group 1's member 0 plays turn 1 under version 0, turn 2 under 1 and turn 3 under 2 (held at
    both updates); its sibling finished in step 0. Step 2 trains the group: one sample per episode,
    each token with the version that sampled it and the behaviour log-prob it was sampled with; the
    ages and the tokens per version count those tokens."""
    engine = _scripted()
    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=1, group_size=2, carry_over_groups=1, max_age=2)
    manager = HeldAt(engine, ManagerConfig(max_tokens=16, max_turns=3), hold={((1, 0), 1), ((1, 0), 2)})
    try:
        first = await sched.collect(manager, 0)
        assert list(first.groups) == ["train_0_0"]
        for turn in (1, 2):  # two updates, each releasing the held turn while the gate is closed
            await engine.update_weights([])
            manager.hold[(1, 0), turn].set()
            await _until(lambda turn=turn: sched.gate.held >= turn)
            sched.resume()
            if turn == 1:
                await _until(lambda: len(manager.trajs[1, 0].turns) == 2)
                middle = await sched.collect(manager, 1)
                assert "train_1_1" not in middle.groups and "train_1_1" in sched.in_flight  # age 2 <= max_age
        await _until(lambda: all(t.done() for t in sched._live["train_1_1"].tasks))
        batch = await sched.collect(manager, 2)
        assert "train_1_1" in batch.groups
        held, sibling = batch.groups["train_1_1"]
        turns = held.trajectory.turns
        assert [t.policy_version for t in turns] == [0, 1, 2]
        sample = held.samples[0]
        expected = [t.policy_version for t in turns for _ in t.response_ids]
        assert sample.response_versions() == expected and sorted(set(expected)) == [0, 1, 2]
        assert sample.policy_version == 0  # the oldest token's
        # -1 exactly on the context tokens, and each response token's behaviour log-prob is its turn's
        assert [v < 0 for v in sample.token_versions] == [not m for m in sample.response_mask]
        assert [lp for lp, m in zip(sample.old_logprobs, sample.response_mask, strict=True) if m] == \
            [lp for t in turns for lp in t.response_logprobs]
        assert set(sibling.samples[0].response_versions()) == {0}

        trained = [s for e in batch.episodes for s in e.samples]
        by_version = {}
        for s in trained:
            for v in s.response_versions():
                by_version[v] = by_version.get(v, 0) + 1
        n = [len(t.response_ids) for t in turns]
        sib = sibling.samples[0].num_response_tokens
        assert by_version[0] == n[0] + sib and by_version[1] == n[1]
        m = batch.metrics
        for version, count in by_version.items():  # serving: version 2
            assert m[f"rollout/tokens_lag_{2 - version}"] == count
        assert m["rollout/partial_age_max"] == 2
        ages = [2 - v for s in trained for v in s.response_versions()]
        assert m["rollout/partial_token_age_mean"] == pytest.approx(sum(ages) / len(ages))
        episode_ages = [2 - min(s.response_versions()) for e in batch.episodes for s in e.samples]
        assert m["rollout/partial_age_mean"] == pytest.approx(sum(episode_ages) / len(episode_ages))
    finally:
        await sched.aclose()
        await engine.close()


async def test_max_age_drops_by_the_oldest_token_not_the_launch(tiny_path):
    """max_age 0: at the update, group 1 holds tokens of version 0 (one version behind when the next
    step trains it): dropped. Group 2 was launched in the same step but has sampled nothing yet (it
    waits to start): it holds nothing stale, so it is carried, and trains in step 1 with age 0."""
    engine = _scripted()
    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=1, group_size=1, carry_over_groups=2, max_age=0)
    manager = HeldAt(engine, ManagerConfig(max_tokens=16, max_turns=3), hold={((1, 0), 1)}, late={2})
    try:
        batch = await sched.collect(manager, 0)
        m = batch.metrics
        assert list(batch.groups) == ["train_0_0"]
        assert m["rollout/partial_dropped_groups"] == 1 and "train_1_1" not in sched.in_flight
        assert m["rollout/partial_dropped_tokens"] == len(manager.trajs[1, 0].turns[0].response_ids) > 0
        assert "train_2_2" in sched.in_flight
        await engine.update_weights([])
        sched.resume()
        manager.start[2].set()
        await _until(lambda: all(t.done() for t in sched._live["train_2_2"].tasks))
        batch = await sched.collect(manager, 1)
        assert "train_2_2" in batch.groups
        assert set(batch.groups["train_2_2"][0].samples[0].response_versions()) == {1}
        assert batch.metrics["rollout/partial_age_max"] == 0
    finally:
        await sched.aclose()
        await engine.close()


def test_a_sample_s_policy_version_is_its_oldest_token_s():
    spec = EpisodeSpec("e", 0, "g", 0)
    traj = Trajectory(env_id="e", group_id="g", episode_id=0, seed=0)
    row = TokenRow().context([1]).generated([2, 3], [-0.1, -0.2], version=4).context([5]).generated([6], [-0.3], version=3)
    sample = Sample.of(spec, traj, row, mode="traj", step_score=0.0, action_valid=True)
    assert sample.token_versions == [-1, 4, 4, -1, 3] and sample.policy_version == 3
    assert sample.response_versions() == [4, 4, 3]
    with pytest.raises(ValueError, match="oldest"):
        Sample.of(spec, traj, row, mode="traj", step_score=0.0, action_valid=True, policy_version=4)
    with pytest.raises(ValueError, match="misaligned"):
        Sample([1, 2], [0, 1], [0.0, 0.0], 0.0, 0.0, "g", "g/0", token_versions=[0])
    with pytest.raises(ValueError, match="no version"):
        Sample([1, 2], [0, 1], [0.0, 0.0], 0.0, 0.0, "g", "g/0", token_versions=[-1, -1])
    # a row some segment of which did not say records none: every token counts as policy_version's
    unknown = TokenRow().generated([2], [-0.1], version=1).generated([3], [-0.1])
    assert Sample.of(spec, traj, unknown, mode="traj", step_score=0.0, action_valid=True,
                     policy_version=1).response_versions() == [1, 1]


@pytest.mark.parametrize("granularity", ["traj", "step"])
async def test_a_proxy_episode_carried_over_an_update_records_each_token_s_version(tiny_path, granularity):
    """An agent's model calls through the proxy: group 1's member 0 is held after its first call
    (sampled by version 0) through an update; its later calls are sampled by version 1. A traj
    sample holds both versions token by token; each step sample its one call's."""
    from arl.rollout import ProxyEnvManager

    engine = _scripted()
    release = asyncio.Event()

    class HeldProxy(ProxyEnvManager):
        async def generate(self, traj, *args, **kwargs):
            gen = await super().generate(traj, *args, **kwargs)
            if traj.group_id == "train_1_1" and traj.episode_id == 0:
                await release.wait()  # after its first call: every later one waits here until released
            return gen

    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=1, group_size=2, carry_over_groups=1, max_age=2)
    async with HeldProxy(engine, ManagerConfig(max_tokens=16, max_turns=3), transport="inprocess",
                         granularity=granularity) as manager:
        try:
            first = await sched.collect(manager, 0)
            assert "train_1_1" not in first.groups
            await engine.update_weights([])
            release.set()
            sched.resume()
            await _until(lambda: all(t.done() for t in sched._live["train_1_1"].tasks))
            batch = await sched.collect(manager, 1)
            held = batch.groups["train_1_1"][0]
            assert held.trajectory.ok and [t.policy_version for t in held.trajectory.turns] == [0, 1, 1]
            versions = [s.response_versions() for s in held.samples]
            if granularity == "traj":
                (one,) = versions
                calls = [t.response_ids for t in held.trajectory.turns]
                assert one == [0] * len(calls[0]) + [1] * (len(calls[1]) + len(calls[2]))
                assert held.samples[0].policy_version == 0
            else:
                assert [set(v) for v in versions] == [{0}, {1}, {1}]
                assert [s.policy_version for s in held.samples] == [0, 1, 1]
            lags = {k: v for k, v in batch.metrics.items() if k.startswith("rollout/tokens_lag_")}
            trained = [v for e in batch.episodes for s in e.samples for v in s.response_versions()]
            assert lags == {f"rollout/tokens_lag_{1 - v}": float(trained.count(v)) for v in set(trained)}
        finally:
            await sched.aclose()
    await engine.close()
