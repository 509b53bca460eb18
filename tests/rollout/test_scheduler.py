"""GroupScheduler seeds and grouping, concurrency, the fault boundary, rollout metrics."""

from __future__ import annotations

import pytest

from arl.config import ManagerConfig
from arl.engine.base import InvalidPromptError, PromptTooLongError
from arl.rollout import (
    VAL_BASE_SEED,
    EpisodeSpec,
    GroupScheduler,
    InternalError,
    StepEnvManager,
    TrajEnvManager,
    collate,
    request_seed,
    rollout_metrics,
)

pytestmark = pytest.mark.anyio

MANAGERS = [TrajEnvManager, StepEnvManager]


def test_specs_seeds_and_groups():
    sched = GroupScheduler("arl/Sokoban-v0", num_groups=3, group_size=4, base_seed=100)
    step0, step1 = sched.specs(0), sched.specs(1)
    assert len(step0) == 12
    for specs in (step0, step1):
        groups: dict[str, list[EpisodeSpec]] = {}
        for s in specs:
            groups.setdefault(s.group_id, []).append(s)
        assert len(groups) == 3
        for members in groups.values():
            assert len({m.seed for m in members}) == 1
            assert [m.episode_id for m in members] == [0, 1, 2, 3]
    assert {s.seed for s in step0} == {100, 101, 102}
    assert {s.seed for s in step1} == {103, 104, 105}  # each step sees new levels
    assert step0[0].group_id == "train_0_100" and step0[0].traj_id == "train_0_100/0"
    assert sched.specs(0) == step0  # deterministic


def test_val_panel_fixed_and_separate():
    sched = GroupScheduler("arl/FrozenLake-v0", num_groups=2, group_size=8)
    val = sched.val_specs(num_seeds=16)
    assert val == sched.val_specs(num_seeds=16)
    assert [s.seed for s in val] == list(range(VAL_BASE_SEED, VAL_BASE_SEED + 16))
    assert all(s.tag == "val" and s.episode_id == 0 for s in val)
    train_seeds = {s.seed for step in range(100) for s in sched.specs(step)}
    assert not train_seeds & {s.seed for s in val}


def test_request_seed():
    config = ManagerConfig(sampling_seed=7)
    a = EpisodeSpec("arl/Sokoban-v0", 1, "train_0_1", 0)
    b = EpisodeSpec("arl/Sokoban-v0", 1, "train_0_1", 1)
    assert request_seed(config, a, 0) == request_seed(ManagerConfig(sampling_seed=7), a, 0)
    seeds = {request_seed(config, s, t) for s in (a, b) for t in range(10)}
    assert len(seeds) == 20 and all(0 <= x < 2**31 for x in seeds)
    assert request_seed(ManagerConfig(sampling_seed=8), a, 0) != request_seed(config, a, 0)
    assert request_seed(ManagerConfig(sampling_seed=None), a, 0) is None


@pytest.mark.parametrize("manager_cls", MANAGERS)
async def test_64_concurrent_episodes(scripted_engine, manager_cls):
    scripted_engine.invalid_rate = 0.2
    scripted_engine.latency_s = 0.001  # force interleaving of the episodes' turns
    sched = GroupScheduler("arl/Sokoban-v0", num_groups=16, group_size=4, max_concurrency=64)
    batch = await sched.run(manager_cls(scripted_engine, ManagerConfig(max_tokens=32)), sched.specs(0))
    assert len(batch.episodes) == 64 and len(batch.groups) == 16
    assert all(e.trajectory.ok for e in batch.episodes), {e.trajectory.error for e in batch.episodes}
    for gid, members in batch.groups.items():
        assert len(members) == 4 and all(e.trajectory.group_id == gid for e in members)
        # Members share the level: equal first observations.
        assert len({e.trajectory.turns[0].observation for e in members}) == 1
    # Episodes and samples come back in spec order whatever the completion order.
    assert [e.trajectory.traj_id for e in batch.episodes] == [s.traj_id for s in sched.specs(0)]
    assert batch.samples == [s for e in batch.episodes for s in e.samples]
    assert batch.metrics["rollout/num_episodes"] == 64
    assert batch.metrics["rollout/num_samples"] == len(batch.samples)
    # Concurrency gives the same samples as playing one at a time (request seeds, not order).
    one = GroupScheduler("arl/Sokoban-v0", num_groups=16, group_size=4, max_concurrency=1)
    serial = await one.run(manager_cls(scripted_engine, ManagerConfig(max_tokens=32)), one.specs(0))
    assert [s.input_ids for s in serial.samples] == [s.input_ids for s in batch.samples]


class RaisingEngine:
    """Just enough of an engine to fail every request."""

    def __init__(self, tokenizer, exc: Exception):
        self.tokenizer, self.exc, self.max_model_len = tokenizer, exc, 2048

    async def generate(self, prompt, params):
        raise self.exc


class BuggyManager(TrajEnvManager):
    async def _play(self, spec, traj):
        raise KeyError("manager bug")


@pytest.mark.parametrize("manager_cls", MANAGERS)
async def test_faults_are_data(tiny_tokenizer, fake_engine_cls, crashing_env_id, manager_cls):
    """A batch mixing healthy and broken episodes: each broken one ends with its typed exit, the
    others complete, abnormal samples are maskable, every exit reason is counted."""
    config = ManagerConfig(max_tokens=32, max_turns=4)
    healthy = [EpisodeSpec("arl/FrozenLake-v0", 11, "train_0_11", m) for m in range(3)]
    # The engine fails every request of member 1 of group "train_1_12" from its second turn on.
    failing = EpisodeSpec("arl/FrozenLake-v0", 12, "train_1_12", 1)
    crash = EpisodeSpec(crashing_env_id, 13, "train_2_13", 0)
    engine = fake_engine_cls(tiny_tokenizer, invalid_every=1)  # invalid answers: episodes never end early
    engine.fail_on = {request_seed(config, failing, 1)}
    sched = GroupScheduler("arl/FrozenLake-v0", 1, 1)
    batch = await sched.run(manager_cls(engine, config), [*healthy, failing, crash])
    exits = [e.trajectory.exit_reason for e in batch.episodes]
    assert exits == ["truncated"] * 3 + ["engine_error", "env_error"]
    fail_traj, crash_traj = batch.episodes[3].trajectory, batch.episodes[4].trajectory
    assert fail_traj.status == "Failed" and "injected failure" in fail_traj.error
    assert crash_traj.status == "Failed" and "the lake cracked" in crash_traj.error
    # The turn completed before the engine failed is still a sample, marked abnormal.
    assert len(fail_traj.turns) == 1 and batch.episodes[3].samples
    assert all(s.exit_reason == "engine_error" and not s.ok for s in batch.episodes[3].samples)
    # The lake cracks on the second step: the first turn survives as (masked) data.
    assert len(crash_traj.turns) == 1 and batch.episodes[4].samples
    assert all(s.exit_reason == "env_error" for s in batch.episodes[4].samples)
    masked = collate(batch.samples, mask_abnormal=True)
    kept = collate(batch.samples)
    for i, s in enumerate(batch.samples):
        assert masked["response_mask"][i].sum().item() == (s.num_response_tokens if s.ok else 0)
        assert kept["response_mask"][i].sum().item() == s.num_response_tokens
    m = batch.metrics
    assert m["rollout/exit/truncated"] == 3 and m["rollout/exit/engine_error"] == 1
    assert m["rollout/exit/env_error"] == 1 and m["rollout/status/Failed"] == 2
    assert m["rollout/abnormal_rate"] == pytest.approx(2 / 5)


async def test_timeout(tiny_tokenizer, fake_engine_cls):
    engine = fake_engine_cls(tiny_tokenizer, latency_s=0.05, invalid_every=1)
    fast = ManagerConfig(max_tokens=32, episode_timeout_s=0.12)
    specs = [EpisodeSpec("arl/FrozenLake-v0", 1, "train_0_1", m) for m in range(4)]
    batch = await GroupScheduler("arl/FrozenLake-v0", 1, 4).run(TrajEnvManager(engine, fast), specs)
    for e in batch.episodes:
        assert e.trajectory.status == "Timeout" and e.trajectory.exit_reason == "timeout"
        assert 1 <= len(e.trajectory.turns) <= 3 and all(not s.ok for s in e.samples)
    assert batch.metrics["rollout/exit/timeout"] == 4
    assert batch.metrics["timing/rollout_s"] < 1.0  # the timeouts ran concurrently


@pytest.mark.parametrize(
    ("exc", "status", "reason"),
    [
        (InvalidPromptError("bad ids"), "Failed", "invalid_prompt"),
        (PromptTooLongError("too long"), "Finished", "max_length"),
    ],
)
async def test_engine_prompt_errors(tiny_tokenizer, exc, status, reason):
    manager = StepEnvManager(RaisingEngine(tiny_tokenizer, exc))
    episode = await manager.run_episode(EpisodeSpec("arl/Sokoban-v0", 0, "train_0_0", 0))
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == (status, reason)
    assert str(exc) in episode.trajectory.error


async def test_internal_error_and_metrics(fake_engine):
    """A traj manager runs no agent code: an unexpected exception in it is arl's own bug."""
    episode = await BuggyManager(fake_engine).run_episode(EpisodeSpec("arl/Sokoban-v0", 0, "g", 0))
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("Failed", "internal_error")
    assert "manager bug" in episode.trajectory.error
    assert "in _play" in episode.trajectory.traceback and "KeyError: 'manager bug'" in episode.trajectory.traceback
    m = rollout_metrics([episode])
    assert m["rollout/exit/internal_error"] == 1 and m["rollout/num_samples"] == 0
    assert m["rollout/exit/agent_error"] == 0
    assert m["env/arl/Sokoban-v0/num_episodes"] == 1
    empty = rollout_metrics([])
    assert empty["rollout/num_episodes"] == 0 and empty["rollout/exit/timeout"] == 0


async def test_timings_recorded(fake_engine):
    episode = await TrajEnvManager(fake_engine).run_episode(EpisodeSpec("arl/Sokoban-v0", 0, "g", 0))
    t = episode.trajectory.timings
    assert set(t) >= {"total", "generate", "env"}
    assert 0 < t["generate"] + t["env"] <= t["total"]


@pytest.mark.parametrize("manager_cls", MANAGERS)
@pytest.mark.parametrize("exc", [KeyError("no such key"), InternalError("invariant broken")])
async def test_unexpected_exceptions_are_internal_errors(fake_engine, monkeypatch, manager_cls, exc):
    """An exception from arl's side of a traj/step episode (here a manager method) ends it as
    internal_error, not agent_error, and keeps the traceback naming the raising function."""
    manager = manager_cls(fake_engine, ManagerConfig(max_tokens=32, max_turns=4))

    def broken_sampling_params(spec, turn):
        raise exc

    monkeypatch.setattr(manager, "sampling_params", broken_sampling_params)
    episode = await manager.run_episode(EpisodeSpec("arl/FrozenLake-v0", 0, "g", 0))
    traj = episode.trajectory
    assert (traj.status, traj.exit_reason) == ("Failed", "internal_error")
    assert traj.error == f"{type(exc).__name__}: {exc}"
    assert "broken_sampling_params" in traj.traceback and type(exc).__name__ in traj.traceback
    assert episode.samples == [] and not traj.ok


@pytest.mark.parametrize("manager_cls", MANAGERS)
async def test_env_crash_keeps_its_traceback(fake_engine, crashing_env_id, manager_cls):
    episode = await manager_cls(fake_engine, ManagerConfig(max_tokens=32)).run_episode(
        EpisodeSpec(crashing_env_id, 13, "g", 0)
    )
    traj = episode.trajectory
    assert (traj.status, traj.exit_reason) == ("Failed", "env_error")
    assert traj.error == "RuntimeError: the lake cracked"
    # The env's own frame and the EnvError that wrapped it (format_exc follows the chain).
    assert "in step" in traj.traceback and "RuntimeError: the lake cracked" in traj.traceback
    assert "EnvError: the lake cracked" in traj.traceback


async def test_normal_episodes_have_no_traceback(fake_engine):
    episode = await TrajEnvManager(fake_engine).run_episode(EpisodeSpec("arl/Sokoban-v0", 0, "g", 0))
    assert episode.trajectory.ok and episode.trajectory.traceback is None


def test_spare_groups_seeds():
    sched = GroupScheduler("arl/Sokoban-v0", num_groups=3, group_size=2, base_seed=100, spare_groups=2)
    assert {s.seed for s in sched.specs(0)} == {100, 101, 102, 103, 104}
    assert {s.seed for s in sched.specs(1)} == {105, 106, 107, 108, 109}  # disjoint: the stride is G + k
    with pytest.raises(ValueError, match="spare_groups"):
        GroupScheduler("arl/Sokoban-v0", num_groups=3, group_size=2, spare_groups=-1)


class SlowGroups(TrajEnvManager):
    """Members of the groups in `slow` take a minute; the others play at once."""

    def __init__(self, *args, slow: set[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.slow, self.cancelled = slow, 0

    async def run_episode(self, spec):
        import anyio

        if int(spec.group_id.split("_")[1]) in self.slow:
            try:
                await anyio.sleep(60)
            except anyio.get_cancelled_exc_class():
                self.cancelled += 1
                raise
        return await super().run_episode(spec)


async def test_spare_groups_keep_the_first_finished(scripted_engine):
    """Over-provisioning: 3 of 5 groups are kept, the 2 stragglers are cancelled, not waited for."""
    import time

    sched = GroupScheduler("arl/Sokoban-v0", num_groups=3, group_size=2, spare_groups=2)
    manager = SlowGroups(scripted_engine, ManagerConfig(max_tokens=32), slow={1, 3})
    start = time.perf_counter()
    batch = await sched.run(manager, sched.specs(0), keep_groups=3)
    assert time.perf_counter() - start < 30  # the minute-long groups were not waited for
    assert manager.cancelled == 4  # both members of both slow groups
    kept = [s for s in sched.specs(0) if int(s.group_id.split("_")[1]) in (0, 2, 4)]
    assert [e.trajectory.traj_id for e in batch.episodes] == [s.traj_id for s in kept]  # spec order
    assert list(batch.groups) == [kept[0].group_id, kept[2].group_id, kept[4].group_id]
    assert batch.metrics["rollout/groups_dropped"] == 2 and batch.metrics["rollout/num_episodes"] == 6
    # without spares, or keeping at least every group, nothing is dropped and nothing is reported
    plain = GroupScheduler("arl/Sokoban-v0", num_groups=3, group_size=2)
    full = await plain.run(TrajEnvManager(scripted_engine, ManagerConfig(max_tokens=32)), plain.specs(0), keep_groups=3)
    assert len(full.episodes) == 6 and "rollout/groups_dropped" not in full.metrics
