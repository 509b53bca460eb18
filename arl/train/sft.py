"""Supervised warm-start: teach a model the answer format before RL.

For the tiny random-init model, RL cannot start from nothing: it never emits a parseable
`<answer>X</answer>`, so every reward is the same format penalty and every advantage is zero.
The warm-start plays episodes with a *teacher* engine answering *uniformly random valid actions*,
through the very manager (and so the very prompts, or the very agent code in proxy mode) RL will
use, and fits the model to those answers with cross-entropy on the response tokens. It teaches
the format, not the game: the targets carry no information about which action is good.

The default teacher is the scripted engine: `<answer>X</answer>` replies, or `move` tool calls
(``sft.teacher: tool_calls``, automatic for ``rollout.proxy.runner: tool``) for agents that act
through function calling. Any engine can teach (``format_warm_start(trainer, teacher=...)``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import numpy as np
import torch

from arl.algo import predicting_positions, token_logprobs
from arl.engine.scripted import ScriptedEngine
from arl.envs.text import game_action_names
from arl.envs.tools import TOOL_NAME
from arl.rollout import GroupScheduler, collate
from arl.rollout.factory import close_manager
from arl.rollout.scheduler import check_batch
from arl.train.lora import vision_towers
from arl.train.precision import forward_precision
from arl.train.update import response_logits, rows_of

log = logging.getLogger(__name__)

# A random valid `move` call in the <tool_call> convention arl's proxy parses ({action} is filled in).
TOOL_CALL_ANSWER = "<tool_call>" + json.dumps({"name": TOOL_NAME, "arguments": {"direction": "{action}"}}) + "</tool_call>"


def teacher_engine(trainer: Any) -> ScriptedEngine:
    """The scripted teacher ``config.sft.teacher`` names (random valid actions, answers or tool calls).
    For a VLM it renders images with the policy engine's renderer, not fake pixels, so image
    observations warm-start on the pixels and image tokens the policy sees."""
    c = trainer.config
    kind = c.sft.teacher
    if kind == "auto":
        kind = "tool_calls" if c.rollout.mode == "proxy" and c.rollout.proxy.runner == "tool" else "answers"
        if getattr(trainer, "manager_injected", False):
            log.warning("sft.teacher=auto with an injected manager: teaching %s; set sft.teacher=tool_calls "
                        "for an agent that acts through function calls", kind)
    answer = TOOL_CALL_ANSWER if kind == "tool_calls" else "<answer>{action}</answer>"
    try:  # the game's own names: a teacher answering "Up" in a game of "North" teaches invalid actions
        actions = game_action_names(c.rollout.env_id)
    except TypeError as e:
        raise ValueError(f"the scripted warm-start teacher plays arl games only ({e}); pass "
                         "format_warm_start(trainer, teacher=...) or set sft.steps=0") from e
    teacher = ScriptedEngine(trainer.tokenizer, seed=c.seed, max_model_len=trainer.engine.max_model_len,
                             answer_format=answer, actions=actions)
    renderer = getattr(trainer.engine, "image_renderer", None)
    if renderer is not None:  # a VLM's: the teacher's image samples carry the policy's expansion and pixels
        teacher.image_renderer = renderer
    return teacher


async def format_warm_start(trainer: Any, manager: Any = None, teacher: Any = None) -> dict[str, float]:
    """`config.sft.steps` optimizer steps of cross-entropy on the teacher's episodes.

    ``manager`` plays them (default: the trainer's manager re-built on the teacher, so the prompts
    are exactly RL's); ``teacher`` answers (default: `teacher_engine`).
    """
    c = trainer.config
    own_teacher = teacher is None
    teacher = teacher_engine(trainer) if own_teacher else teacher
    own_manager = manager is None
    manager = trainer.manager.derive(engine=teacher) if own_manager else manager
    groups = GroupScheduler(
        c.rollout.env_id, num_groups=c.sft.batch_episodes, group_size=1,
        base_seed=c.seed * 1_000_003 + 500_000_000, tag="sft",
    )
    frozen = [] if c.sft.train_vision else frozen_vision(trainer.model)
    optimizer = torch.optim.AdamW([p for p in trainer.model.parameters() if p.requires_grad], lr=c.sft.lr)
    start, losses = time.perf_counter(), []
    try:
        for step in range(c.sft.steps):
            batch = await groups.run(manager, groups.specs(step))
            check_batch(batch, f"format warm-start step {step}")
            samples = [s for s in batch.samples if s.num_response_tokens > 0]
            losses.append(await asyncio.to_thread(_sft_update, trainer.model, optimizer, samples, trainer, c))
    finally:
        for param in frozen:
            param.requires_grad_(True)
        if own_manager:
            await close_manager(manager)
        if own_teacher:
            await teacher.close()
    out = {"sft/steps": float(len(losses)), "timing/sft_s": time.perf_counter() - start}
    if losses:  # no step, no loss: absent, not NaN (a metric is measured or absent)
        out.update({"sft/loss_first": float(losses[0]), "sft/loss_last": float(np.mean(losses[-5:]))})
    return out


async def warm_start(trainer: Any) -> dict[str, float]:
    """The warm-start ``config.sft`` asks for: the perception warm-start (``sft.perception_steps``,
    `arl.train.perception`), then the format warm-start (``sft.steps``); their metrics together."""
    c = trainer.config
    out: dict[str, float] = {}
    if c.sft.perception_steps > 0:
        from arl.train.perception import perception_warm_start  # it builds on this module's update

        out.update(await perception_warm_start(trainer))
    if c.sft.steps > 0:
        out.update(await format_warm_start(trainer))
    return out


def frozen_vision(model: Any) -> list[Any]:
    """Freeze a VLM's vision tower(s) (`vision_towers`) for the warm-start; returns the parameters it
    froze (the caller unfreezes them). The warm-start's targets are random actions that say nothing
    about the image; fitting the tower to them (30 steps, the demo's warm-start) collapsed tiny-vl's
    image tokens onto one direction: every FrozenLake cell type's mean embedding at cosine >= 0.97
    to every other, the player's and an ice cell's at 0.9995, where the fresh tower keeps them at
    0.39-0.72 (benchmarks/vision_probe.py, results/vision-probe-tinyvl-*.json). Under the decoder's
    RMSNorm only the direction counts: after such a warm-start the policy cannot see where it
    stands. Nothing for a text model.

    >>> import torch
    >>> frozen_vision(torch.nn.Linear(2, 2))
    []
    """
    frozen = [p for tower in vision_towers(model) for p in model.get_submodule(tower).parameters() if p.requires_grad]
    for param in frozen:
        param.requires_grad_(False)
    return frozen


def _sft_update(model: Any, optimizer: Any, samples: list, trainer: Any, c: Any) -> float:
    """One optimizer step of token-mean cross-entropy over the batch's response tokens."""
    device = next(model.parameters()).device
    batch = collate(samples, pad_id=trainer.tokenizer.pad_token_id or 0)
    total = batch["response_mask"].sum().clamp(min=1).to(device)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for start in range(0, len(samples), c.sft.micro_batch_size):
        rows = rows_of(batch, np.arange(start, min(start + c.sft.micro_batch_size, len(samples))), device)
        keep = predicting_positions(rows["response_mask"])  # only response tokens are targets
        with forward_precision(model, c.optim.precision):  # as the RL update computes
            logits = response_logits(model, rows, keep)
        logp = token_logprobs(logits, rows["input_ids"], positions=keep)
        loss = -(logp * rows["response_mask"]).sum() / total
        loss.backward()
        loss_sum += float(loss.detach())
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    return loss_sum
