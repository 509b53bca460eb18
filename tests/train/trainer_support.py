"""Shared by the trainer tests: a small FrozenLake config, a scripted engine, parameter snapshots."""

from __future__ import annotations

import json

import torch

from arl.config import load_config
from arl.engine import make_engine
from arl.train import Trainer


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


async def uninterrupted_then_killed(tmp_path, *overrides: str, killed_after: int = 1):
    """The exact-resume set-up: `overrides` trained to the end in tmp_path/full, and the same run
    in tmp_path/part killed after `killed_after` steps. Returns (the full run's final parameters,
    the config that resumes the killed one)."""
    full = small_config(tmp_path / "full", *overrides)
    async with Trainer(full, engine=scripted(full)) as trainer:
        await trainer.train()
        want = params_of(trainer.model)
    killed = small_config(tmp_path / "part", *overrides, f"steps={killed_after}")
    async with Trainer(killed, engine=scripted(killed)) as trainer:
        await trainer.train()
    return want, small_config(tmp_path / "part", *overrides)


def metrics_rows(run_dir) -> list[dict]:
    """A run's metrics.jsonl rows without timings and evaluations (a killed run also evaluated at
    its last step), for comparing a resumed run with an uninterrupted one."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("timing/", "eval/"))} for line in lines]

