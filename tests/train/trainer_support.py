"""Shared by the trainer tests: a small FrozenLake config, a scripted engine, parameter snapshots."""

from __future__ import annotations

import torch

from arl.config import load_config
from arl.engine import make_engine


def small_config(tmp_path, *overrides: str):
    base = [
        f"out_dir={tmp_path}", "name=t", "steps=2", "tensorboard=false",
        "rollout.env_id=arl/FrozenLake-v0", "rollout.mode=step", "rollout.num_groups=2", "rollout.group_size=4",
        "rollout.manager.max_tokens=8", "rollout.manager.history_len=0",
        "eval.num_seeds=4", "eval.every=0", "eval.at_start=false", "optim.lr=0.01", "optim.micro_batch_size=8",
        "engine.max_model_len=1024",
    ]
    return load_config(None, base + list(overrides))


def scripted(config):
    return make_engine(backend="scripted", model=config.model, max_model_len=1024, scripted={"invalid_rate": 0.3})


def params_of(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


async def step_gradients(trainer) -> dict[str, torch.Tensor]:
    """One `trainer.step()` with the optimizer step replaced by a copy of every parameter's
    gradient: what the update would have applied, the parameters left as they were."""
    captured: dict[str, torch.Tensor] = {}

    def capture() -> None:
        captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.optimizer.step = capture
    await trainer.step()
    return captured

