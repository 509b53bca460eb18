"""Partial rollouts (rollout.partial) and a crash: a run that dies in the middle of a step, after
checkpoints taken while a group was carried over, resumes from its last checkpoint without the
carried group (dropped, counted: the documented choice, arl/rollout/partial.py) and trains no
token twice along the run that survives (the checkpointed steps, then the resumed ones)."""

from __future__ import annotations

import pytest
from trainer_support import metrics_rows, scripted, small_config

from arl.train import Trainer
from tests.rollout.test_partial import Held

pytestmark = pytest.mark.anyio

PARTIAL = ("rollout.partial.enabled=true", "rollout.partial.carry_over_groups=1", "rollout.partial.max_age=2",
           "rollout.mode=traj", "rollout.manager.max_turns=3", "save_every=1")


class Crash(RuntimeError):
    pass


def _trained_keys(trainer, crash_on: int | None = None):
    """Per update that was applied, the (group, traj) ids it trained; update number ``crash_on``
    (0-based) raises before it trains anything, like a process killed there."""
    trained: list[list[tuple[str, str]]] = []
    update = trainer.update

    def recorded(samples, advantages):
        if crash_on is not None and len(trained) == crash_on:
            raise Crash("killed mid-step")
        metrics = update(samples, advantages)
        trained.append([(s.group_id, s.traj_id) for s in samples])
        return metrics

    trainer.update = recorded
    return trained


async def test_a_crash_after_checkpoints_with_a_carried_group_trains_no_token_twice(tmp_path):
    config = small_config(tmp_path, *PARTIAL, "steps=4")
    # group 1's member 0 never comes back: carried at both checkpoints (after steps 0 and 1)
    crashed = Held(scripted(config), config.rollout.manager, hold={(1, 0)})
    async with Trainer(config, manager=crashed) as trainer:
        await trainer.setup()
        before = _trained_keys(trainer, crash_on=2)
        with pytest.raises(Crash):
            await trainer.train()
        assert trainer.step_count == 2
    assert "train_1_1" not in {g for step in before for g, _ in step}

    async with Trainer(config, manager=Held(scripted(config), config.rollout.manager), resume=True) as trainer:
        await trainer.setup()
        assert trainer.step_count == 2  # the last checkpoint: the crashed step is played again
        after = _trained_keys(trainer)
        await trainer.train()
    assert trainer.step_count == 4
    lineage = [key for step in before + after for key in step]
    assert len(lineage) == len(set(lineage)) == 4 * 2 * 4  # every trained episode once: 4 steps x 2 groups x 4
    assert all(int(g.split("_")[1]) >= 4 for step in after for g, _ in step)  # after the checkpoint's groups 0..3
    rows = {r["step"]: r for r in metrics_rows(trainer.run_dir)}
    assert sorted(rows) == [1, 2, 3, 4]  # one row per step of the surviving run
    assert rows[3]["rollout/partial_dropped_on_resume"] == 1 and "rollout/partial_dropped_on_resume" not in rows[4]
