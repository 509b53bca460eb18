"""The format warm-start leaves a VLM's vision tower alone (`arl.train.sft.frozen_vision`) unless
``sft.train_vision`` is on: its targets are random actions that say nothing about the image. On the
zoo's tiny-vl showing FrozenLake's frames (HF engine; the scripted teacher renders with its
processor): the tower's weights are bit for bit what they were, the decoder's moved, and every
parameter is trainable again afterwards, in the RL optimizer, so RL trains the tower."""

from __future__ import annotations

import pytest
import torch
from trainer_support import params_of, small_config

from arl.train import Trainer
from arl.train.lora import vision_towers
from arl.train.sft import format_warm_start

pytestmark = pytest.mark.anyio


async def _warm_start(tmp_path, *overrides: str):
    """(parameters before, parameters after, the tower's parameter names, the trainer) of one
    warm-start step on frames."""
    c = small_config(tmp_path, "model=tiny-vl", "engine.backend=hf", "rollout.manager.observation=image",
                     "rollout.manager.prompt_style=compact", "rollout.manager.max_turns=2", "rollout.num_groups=1",
                     "sft.steps=1", "sft.batch_episodes=2", "sft.micro_batch_size=8", *overrides)
    async with Trainer(c) as trainer:
        await trainer.setup()
        model = trainer.model
        [tower] = vision_towers(model)
        in_tower = {f"{tower}.{n}" for n, _ in model.get_submodule(tower).named_parameters()}
        assert in_tower and all(p.requires_grad for p in model.parameters())  # everything trains before
        before = params_of(model)
        metrics = await format_warm_start(trainer)
        assert metrics["sft/steps"] == 1
        after = params_of(model)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
        tower_in_optimizer = all(id(p) in in_optimizer for p in model.get_submodule(tower).parameters())
    return before, after, in_tower, trainable, tower_in_optimizer


def _changed(before: dict, after: dict, names) -> list[str]:
    return [n for n in names if not torch.equal(before[n], after[n])]


async def test_the_warm_start_keeps_the_vision_tower_and_rl_trains_it_after(tmp_path):
    before, after, in_tower, trainable, tower_in_optimizer = await _warm_start(tmp_path)
    assert _changed(before, after, in_tower) == []  # bit-identical
    decoder = [n for n in before if n not in in_tower]
    assert _changed(before, after, decoder)  # the format was learned by the decoder
    assert trainable == set(before)  # every parameter trainable again: RL trains the tower
    assert tower_in_optimizer


async def test_sft_train_vision_trains_the_tower_too(tmp_path):
    before, after, in_tower, trainable, _ = await _warm_start(tmp_path, "sft.train_vision=true")
    assert _changed(before, after, in_tower)
    assert trainable == set(before)
