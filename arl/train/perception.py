"""Perception warm-start: teach a VLM policy to read the board from its frame, before RL.

A pretrained VLM (Qwen2.5-VL) comes to RL able to read an image; the zoo's tiny-vl (random init)
has never learned to see. From frames alone it does not learn FrozenLake under RL, although
supervised on the same frames it can (benchmarks/README.md, "Supervised ceiling"); after this
warm-start it does (benchmarks/README.md, "From pixels"). This warm-start
(``sft.perception_steps`` optimizer steps) teaches the one thing a pretrained VLM would bring:
captioning. Each sample is a prompt showing one frame of a random board state (the game's own
``frame()``) and the instruction `INSTRUCTION`, in the chat format of the policy's manager, with the
game's ``grid_text()`` as the reply (closed by the template's end of turn). It says nothing about
which action is good: the boards are reset states of fresh seeds (`PERCEPTION_SEED_OFFSET`, a range
no training, validation or format warm-start seed comes from), then 0-3 uniformly random actions so
the player is not always at the start.

The samples are RL's: `Sample` rows with the prompt's `RenderedPrompt` (the policy engine's image
renderer, so the expanded ids and pixels the trainer's forward gets), the loss mask on the reply
only, and the same update (`arl.train.sft._sft_update`, token-mean cross-entropy). The vision
tower trains (the format warm-start's `frozen_vision` keeps it out of a target that is not about
the image; here the target is the image). It runs before the format warm-start (`arl.train.sft.warm_start`).

Measured after the steps, on `HELD_OUT_BOARDS` boards from another seed range: the fraction of
cells, and of whole boards, whose reply tokens are the model's argmax under teacher forcing
(``sft/perception_cell_acc``, ``sft/perception_board_acc``; `read_accuracy`). A cell counts right
when the token that writes it is the argmax after the right tokens before it: cheaper than
decoding, and equal to it for a board that is right throughout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from arl.algo import predicting_positions
from arl.config import ConfigError
from arl.engine.tokens import TokenRow
from arl.envs.text import TextEnv
from arl.intercept.template import chat_ids, end_of_turn_ids
from arl.rollout import collate
from arl.rollout.records import Sample
from arl.train.lora import vision_towers
from arl.train.precision import forward_precision
from arl.train.sft import _sft_update
from arl.train.update import response_logits, rows_of

INSTRUCTION = "Write the board as text."
# Board seeds: c.seed * 1_000_003 + this + i; training steps count up from c.seed * 1_000_003, the
# format warm-start from + 500_000_000 (arl/train/sft.py), validation from 1_000_000_000.
PERCEPTION_SEED_OFFSET = 600_000_000
HELD_OUT_OFFSET = 700_000_000  # the held-out boards read_accuracy scores
HELD_OUT_BOARDS = 32
MAX_RANDOM_MOVES = 3


@attrs.frozen
class Board:
    """One board state to read: the seed it was reset to, its frame and its text."""

    seed: int
    frame: np.ndarray
    text: str


def check_perception(trainer: Any) -> None:
    """`ConfigError` unless the perception warm-start can run on ``trainer``: a policy with a vision
    tower (its engine with an image renderer), and a game that draws a ``frame()`` and writes a
    ``grid_text()``."""
    c = trainer.config  # observation=text with perception_steps is the config's own error (TrainConfig)
    env = make_env(c)
    try:
        game = env.unwrapped
        missing = [name for name in ("frame", "grid_text") if not callable(getattr(game, name, None))]
    finally:
        env.close()
    if missing:
        raise ConfigError(f"sft.perception_steps: rollout.env_id={c.rollout.env_id!r} ({type(game).__name__}) has no "
                          f"{' and no '.join(f'{m}()' for m in missing)}: the perception warm-start shows a frame "
                          "and teaches its text (FrozenLake and Sokoban have both)")
    if not vision_towers(trainer.model) or getattr(trainer.engine, "image_renderer", None) is None:
        raise ConfigError(f"sft.perception_steps={c.sft.perception_steps} trains a vision tower, and model="
                          f"{c.model!r} has none (serve a VLM, e.g. the zoo's tiny-vl, or sft.perception_steps=0)")


def make_env(c: Any) -> TextEnv:
    """The game as the policy's manager makes it (`arl.rollout.base.EnvManager.make_env`'s arguments)."""
    m = c.rollout.manager
    return TextEnv(c.rollout.env_id, format_penalty=m.format_penalty, **m.env_kwargs)


def boards(env: TextEnv, seeds: Sequence[int]) -> list[Board]:
    """A board per seed: ``env`` reset to it, then 0-`MAX_RANDOM_MOVES` uniformly random actions
    (fewer where the game ends first), all drawn from the seed.

    >>> [b.text.count("P") for b in boards(TextEnv("arl/FrozenLake-v0"), [1, 2])]
    [1, 1]
    """
    game = env.unwrapped
    out = []
    for seed in seeds:
        env.reset(seed=int(seed))
        rng = np.random.default_rng(int(seed))
        for _ in range(int(rng.integers(0, MAX_RANDOM_MOVES + 1))):
            if game.step(int(rng.integers(len(game.action_names))))[2]:  # terminated: a hole, the goal
                break
        out.append(Board(int(seed), game.frame(), game.grid_text()))
    return out


def perception_samples(manager: Any, boards: Sequence[Board], env_id: str = "") -> list[Sample]:
    """One sample per board, token for token as the manager's own would be: the chat prompt of one
    user turn (the frame, then `INSTRUCTION`; the manager's ``system_prompt`` first when it has one)
    rendered by the policy engine's image renderer (`EnvManager.render`: expanded ids, pixels), then
    the board's text and the template's end of turn as the reply, the only tokens with the loss mask."""
    tok = manager.tokenizer
    messages = [manager.with_frame({"role": "user", "content": INSTRUCTION})]
    if manager.config.system_prompt is not None:
        messages.insert(0, {"role": "system", "content": manager.config.system_prompt})
    prompt = chat_ids(tok, messages)
    eot = end_of_turn_ids(tok)
    out = []
    for board in boards:
        rendered = manager.render(prompt, [board.frame])
        reply = [int(t) for t in tok.encode(board.text, add_special_tokens=False)] + eot
        row = TokenRow.turn(rendered.input_ids, reply, [0.0] * len(reply))
        out.append(Sample(input_ids=row.ids, response_mask=row.mask, old_logprobs=row.logprobs, episode_score=0.0,
                          step_score=0.0, group_id=f"perception_{board.seed}", traj_id=f"perception_{board.seed}",
                          env_id=env_id, exit_reason="terminated",
                          info={"tag": "perception", "seed": board.seed}, rendered=rendered))
    return out


@torch.no_grad()
def read_accuracy(model: Any, samples: Sequence[Sample], tokenizer: Any, *, precision: str = "fp32",
                  micro_batch_size: int = 32) -> tuple[float, float]:
    """(cell accuracy, board accuracy) of ``model`` reading ``samples`` (`perception_samples`)
    under teacher forcing: a reply token is right when it is the argmax of the logits before it; a
    cell is right when the token that writes it is (the reply's characters other than newlines, the
    template's end of turn left out); a board when all its cells are."""
    device = next(model.parameters()).device
    eot = len(end_of_turn_ids(tokenizer))
    batch = collate(list(samples), pad_id=tokenizer.pad_token_id or 0)
    cells_right = cells = boards_right = 0
    for start in range(0, len(samples), micro_batch_size):
        rows = rows_of(batch, np.arange(start, min(start + micro_batch_size, len(samples))), device)
        keep = predicting_positions(rows["response_mask"])
        with forward_precision(model, precision):
            predicted = response_logits(model, rows, keep).argmax(dim=-1).cpu()  # (B, K)
        column = torch.full((rows["input_ids"].shape[1],), -1, dtype=torch.long)
        column[keep.cpu()] = torch.arange(len(keep))
        ids, mask = rows["input_ids"].cpu(), rows["response_mask"].cpu()
        for b in range(len(ids)):
            at = torch.nonzero(mask[b]).squeeze(-1)
            at = at[: len(at) - eot]  # the board's tokens
            right = predicted[b, column[at - 1]] == ids[b, at]
            widths = [len(tokenizer.decode([int(t)]).replace("\n", "")) for t in ids[b, at]]
            board_right = sum(w for w, r in zip(widths, right.tolist(), strict=True) if r)
            cells_right, cells = cells_right + board_right, cells + sum(widths)
            boards_right += int(board_right == sum(widths))
    return cells_right / max(cells, 1), boards_right / max(len(samples), 1)


async def perception_warm_start(trainer: Any) -> dict[str, float]:
    """``config.sft.perception_steps`` optimizer steps of cross-entropy on ``sft.perception_batch``
    fresh boards each (`perception_samples` through the trainer's manager), every weight trained,
    then `read_accuracy` on `HELD_OUT_BOARDS` boards no step showed."""
    c = trainer.config
    check_perception(trainer)
    manager, model = trainer.manager, trainer.model
    base = c.seed * 1_000_003 + PERCEPTION_SEED_OFFSET
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=c.sft.lr)
    env = make_env(c)
    start, losses = time.perf_counter(), []
    try:
        for step in range(c.sft.perception_steps):
            seeds = range(base + step * c.sft.perception_batch, base + (step + 1) * c.sft.perception_batch)
            samples = perception_samples(manager, boards(env, seeds), c.rollout.env_id)
            losses.append(await asyncio.to_thread(_sft_update, model, optimizer, samples, trainer, c))
        held_out = range(c.seed * 1_000_003 + HELD_OUT_OFFSET, c.seed * 1_000_003 + HELD_OUT_OFFSET + HELD_OUT_BOARDS)
        samples = perception_samples(manager, boards(env, held_out), c.rollout.env_id)
    finally:
        env.close()
    cell_acc, board_acc = await asyncio.to_thread(read_accuracy, model, samples, trainer.tokenizer,
                                                  precision=c.optim.precision, micro_batch_size=c.sft.micro_batch_size)
    out = {"sft/perception_steps": float(len(losses)), "sft/perception_cell_acc": cell_acc,
           "sft/perception_board_acc": board_acc, "timing/perception_s": time.perf_counter() - start}
    if losses:
        out.update({"sft/perception_loss_first": float(losses[0]),
                    "sft/perception_loss_last": float(np.mean(losses[-5:]))})
    return out


__all__ = ["HELD_OUT_BOARDS", "INSTRUCTION", "PERCEPTION_SEED_OFFSET", "Board", "boards", "check_perception",
           "perception_samples", "perception_warm_start", "read_accuracy"]
