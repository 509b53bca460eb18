"""The trainer with partial rollouts (rollout.partial): a group still running at an update is trained
in a later step, once, with its age and the tokens of each policy version measured; a checkpoint
taken while a group is carried resumes without it (counted) and trains no token twice."""

from __future__ import annotations

import pytest
from trainer_support import scripted, small_config

from arl.config import ConfigError
from arl.train import Trainer
from tests.rollout.test_partial import Held

pytestmark = pytest.mark.anyio

PARTIAL = ("rollout.partial.enabled=true", "rollout.partial.carry_over_groups=1", "rollout.partial.max_age=2",
           "rollout.mode=traj", "rollout.manager.max_turns=3")


def _recording(trainer):
    """Record the (group, traj) ids each update trains, by step."""
    trained: list[list[tuple[str, str]]] = []
    update = trainer.update

    def recorded(samples, advantages):
        trained.append([(s.group_id, s.traj_id) for s in samples])
        return update(samples, advantages)

    trainer.update = recorded
    return trained


async def test_a_group_running_at_the_update_trains_later_once(tmp_path):
    config = small_config(tmp_path, *PARTIAL, "steps=3")
    engine = scripted(config)
    manager = Held(engine, config.rollout.manager, hold={(1, 0)})
    async with Trainer(config, manager=manager) as trainer:
        await trainer.setup()
        trained = _recording(trainer)
        push = trainer.push_weights

        async def push_then_release(*args, **kwargs):
            await push(*args, **kwargs)
            manager.hold[(1, 0)].set()  # the held episode's env step ends during the first update

        trainer.push_weights = push_then_release
        rows = await trainer.train()
    flat = [key for step in trained for key in step]
    assert len(flat) == len(set(flat)) == 3 * 2 * 4  # every trained episode once: 3 steps x 2 groups x 4
    assert "train_1_1" not in {g for g, _ in trained[0]}  # it was running at the first update
    later = next(i for i, step in enumerate(trained) if "train_1_1" in {g for g, _ in step})
    assert later in (1, 2) and rows[0]["rollout/partial_carried_groups"] == 1
    assert rows[later]["rollout/partial_age_max"] == later  # launched in step 0, trained in step `later`
    assert rows[later]["rollout/tokens_lag_1"] > 0 or rows[later].get("rollout/tokens_lag_2", 0) > 0
    held = manager.trajs[(1, 0)]
    assert held.turns[0].policy_version < held.turns[-1].policy_version  # resumed under newer weights
    for row in rows:  # the correction's tails are measured on every step
        assert {"train/is_weight_p99", "train/is_weight_p01", "train/is_weight_capped_frac"} <= set(row)
        assert row["rollout/partial_dropped_groups"] == 0


async def test_a_checkpoint_with_a_carried_group_resumes_without_it(tmp_path):
    config = small_config(tmp_path, *PARTIAL, "steps=1")
    first = Held(scripted(config), config.rollout.manager, hold={(1, 0)})  # never released: carried at the save
    async with Trainer(config, manager=first) as trainer:
        await trainer.setup()
        before = _recording(trainer)
        await trainer.train()
    resumed_config = small_config(tmp_path, *PARTIAL, "steps=3")
    async with Trainer(resumed_config, manager=Held(scripted(resumed_config), resumed_config.rollout.manager),
                       resume=True) as trainer:
        await trainer.setup()
        after = _recording(trainer)
        rows = await trainer.train()
    assert trainer.step_count == 3
    old = {key for step in before for key in step}
    new = [key for step in after for key in step]
    assert not old & set(new) and len(new) == len(set(new))  # no token trained twice
    assert all(int(g.split("_")[1]) >= 3 for g, _ in new)  # new groups after the checkpoint's 0..2
    resumed_rows = [r for r in rows if r["step"] >= 2]
    assert resumed_rows[0]["rollout/partial_dropped_on_resume"] == 1
    assert "rollout/partial_dropped_on_resume" not in resumed_rows[1]


async def test_keep_needs_an_engine_with_a_prefix_cache(tmp_path):
    config = small_config(tmp_path, *PARTIAL, "rollout.partial.kv=keep")
    async with Trainer(config, engine=scripted(config)) as trainer:
        with pytest.raises(ConfigError, match="keeps no KV"):
            await trainer.setup()
