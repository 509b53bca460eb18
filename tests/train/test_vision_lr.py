"""``optim.vision_lr``: a VLM's vision tower in its own optimizer group at its own learning rate
(`arl.train.lora.param_groups`); unset, one group at ``optim.lr`` as before."""

from __future__ import annotations

import pytest
import torch
from trainer_support import params_of, small_config

from arl.train import Trainer
from arl.train.lora import vision_towers

pytestmark = pytest.mark.anyio


async def _groups_and_step(tmp_path, *overrides: str):
    c = small_config(tmp_path, "model=tiny-vl", "engine.backend=hf", "rollout.manager.observation=image",
                     "optim.lr=1e-3", *overrides)
    async with Trainer(c) as trainer:
        await trainer.setup()
        model = trainer.model
        [tower] = vision_towers(model)
        tower_ids = {id(p) for p in model.get_submodule(tower).parameters()}
        groups = [(g["lr"], {id(p) for p in g["params"]}) for g in trainer.optimizer.param_groups]
        before = params_of(model)
        in_tower = {f"{tower}.{n}" for n, _ in model.get_submodule(tower).named_parameters()}
        trainer.optimizer.zero_grad()
        sum(p.float().sum() for p in model.parameters()).backward()  # a gradient of 1 on every weight
        trainer.optimizer.step()
        after = params_of(model)
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    return groups, tower_ids, in_tower, moved, set(before)


async def test_vision_lr_zero_keeps_the_tower_and_trains_the_decoder(tmp_path):
    groups, tower_ids, in_tower, moved, names = await _groups_and_step(tmp_path, "optim.vision_lr=0")
    assert len(groups) == 2 and groups[1][0] == 0.0 and groups[1][1] == tower_ids
    assert not moved & in_tower
    assert moved == names - in_tower


async def test_without_vision_lr_one_group_trains_everything(tmp_path):
    groups, _, in_tower, moved, names = await _groups_and_step(tmp_path)
    assert len(groups) == 1
    assert moved == names
