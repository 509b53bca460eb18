"""Supervised ceiling: can the model learn to pick the optimal move at all, when told it directly?

    .venv/bin/python benchmarks/ceiling.py --game sokoban     # ~6 min on 2 cores (results/ceiling-sokoban.json)
    .venv/bin/python benchmarks/ceiling.py                    # FrozenLake 4x4 (results/ceiling.json)
    .venv/bin/python benchmarks/ceiling.py --game sokoban --checkpoints RUN/ckpt_000080 ...   # + trained policies
    .venv/bin/python benchmarks/ceiling.py --quick            # CI smoke size (~30 s)
    .venv/bin/python benchmarks/ceiling.py model=tiny-vl rollout.manager.observation=image   # from frames (VLM)

When RL on a game stays flat, either the advantages carry no usable signal (benchmarks/credit.py
measures that), or the optimisation does not follow it, or the model cannot represent a good
policy from its prompt. This measures the last. States come from uniformly random valid play
through the game's step manager and prompts (the game's config: configs/tiny_frozenlake_gigpo.yaml
or configs/tiny_sokoban_gigpo.yaml, `--batches` batches of its groups x episodes), each labelled
with its optimal moves by BFS (credit.py's labels; states with no optimal move are left out).
The last 20% of the batches (other levels) give the held-out states: each distinct observation
once, none seen in training.

The model, from the same initialisation RL starts from, is trained with cross-entropy on
(prompt, one optimal move's reply) for `--epochs` passes (AdamW lr 1e-3, 128 states per step).
On the held-out states a policy is scored by the 4 moves' reply log-probabilities:
- accuracy: the most likely move is an optimal one (greedy play's per-state choice);
- p(optimal): the probability mass on optimal moves, normalised over the 4 replies (what sampling
  at temperature 1 plays).
Trailing dotted overrides change the game's config: with ``model=tiny-vl
rollout.manager.observation=image`` the prompts show the game's frame instead of its grid, and the
VLM is trained and scored on the pixels its processor renders (the trainer's forward).
Rows: chance (uniform over the 4 moves), always-the-most-common-optimal-move, the format
warm-start alone (the policy RL starts from), each supervised epoch, and any `--checkpoints`
(RL-trained policies, e.g. a learning-curve run's final checkpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import functools
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _util import quiet_logs, result_path, table, write_result  # noqa: E402
from credit import GAMES  # noqa: E402  (config and BFS label per game)

quiet_logs()

LR, BATCH = 1e-3, 128


async def collect(game: str, batches: int, overrides: list[str]) -> tuple[list[tuple], dict[str, list[int]], Any, Any]:
    """(rows, reply ids per move, trainer-initialised model, (warm-started model, its metrics, pad id))
    from random valid play: RL training's batches of the game's config (its manager and groups)."""
    from arl.config import load_config
    from arl.engine import make_engine
    from arl.rollout.factory import close_manager, make_manager, make_scheduler
    from arl.train import Trainer
    from arl.train.sft import format_warm_start

    config_path, optimal = GAMES[game]
    label = functools.lru_cache(maxsize=None)(optimal)
    config = load_config(config_path, ["tensorboard=false", "out_dir=/tmp/arl-bench-ceiling", "name=ceiling",
                                       "overwrite=true", *overrides])  # a scratch run dir: no checkpoints
    engine = make_engine(backend="scripted", model=config.model, max_model_len=config.engine.max_model_len)
    if config.rollout.manager.observation != "text":  # the model's own processor, not the scripted fake pixels
        from arl.engine.images import ImageRenderer
        from arl.models import resolve_model

        engine.image_renderer = ImageRenderer(resolve_model(config.model), engine.tokenizer)
    manager, scheduler = make_manager(engine, config.rollout), make_scheduler(config.rollout, config.seed)
    rows, replies = [], {}
    async with Trainer(config, manager=manager) as trainer:
        await trainer.setup()
        for b in range(batches):
            batch = await scheduler.run(manager, scheduler.specs(b))
            for episode in batch.episodes:
                for turn in episode.trajectory.turns:
                    if turn.action_valid and turn.action not in replies:
                        replies[turn.action] = list(turn.response_ids)
                    moves = label(turn.observation)
                    if moves:
                        rows.append((b, turn.observation, list(turn.prompt_ids), frozenset(moves), turn.rendered))
        initial = copy.deepcopy(trainer.model)
        warm = await format_warm_start(trainer)
    await close_manager(manager)  # given to the trainer, not owned by it
    return rows, replies, initial, (trainer.model, warm, trainer.tokenizer.pad_token_id or 0)


def sequences_logprob(model: Any, seqs: list[list[int]], prompt_lens: list[int], pad: int,
                      rendered: list[Any] | None = None) -> Any:
    """Sum of log-probs of each sequence's tokens after its prompt, scored as the trainer scores a
    batch (`arl.train.update.sequence_logprobs` on `arl.rollout.collate`'s rows): with ``rendered``
    (each sequence's `RenderedPrompt`, an image observation) the VLM gets the prompts' pixels and
    computes its 3-D rotary positions from the image-token mask. Keeps the autograd graph."""
    from arl.rollout import collate
    from arl.rollout.records import Sample
    from arl.train.update import sequence_logprobs

    rendered = rendered or [None] * len(seqs)
    samples = [Sample(s, [0] * p + [1] * (len(s) - p), [0.0] * len(s), 0.0, 0.0, "ceiling", str(i), rendered=r)
               for i, (s, p, r) in enumerate(zip(seqs, prompt_lens, rendered, strict=True))]
    batch = collate(samples, pad_id=pad)
    logp = sequence_logprobs(model, batch, range(len(seqs)), 1.0, micro_batch_size=len(seqs))
    return (logp * batch["response_mask"]).sum(1)


def score(model: Any, test: list[tuple], moves: list[str], replies: dict[str, list[int]], pad: int) -> dict[str, float]:
    import torch

    model.eval()
    hits, mass = [], []
    with torch.no_grad():
        for i in range(0, len(test), 64):
            chunk = test[i : i + 64]
            seqs = [r[2] + replies[m] for r in chunk for m in moves]
            lp = sequences_logprob(model, seqs, [len(r[2]) for r in chunk for _ in moves], pad,
                                   [r[4] for r in chunk for _ in moves]).view(len(chunk), -1)
            probs = torch.softmax(lp, dim=1)
            for r, p in zip(chunk, probs, strict=True):
                hits.append(moves[int(p.argmax())] in r[3])
                mass.append(float(sum(p[j] for j, m in enumerate(moves) if m in r[3])))
    model.train()
    return {"accuracy": float(np.mean(hits)), "p_optimal": float(np.mean(mass))}


def supervised(model: Any, train: list[tuple], test: list[tuple], moves: list[str], replies: dict[str, list[int]],
               pad: int, epochs: int, seed: int) -> list[dict[str, Any]]:
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    rng = random.Random(seed)
    out = []
    for epoch in range(1, epochs + 1):
        start, order, losses = time.perf_counter(), list(train), []
        rng.shuffle(order)
        for i in range(0, len(order), BATCH):
            chunk = order[i : i + BATCH]
            seqs = [r[2] + replies[rng.choice(sorted(r[3]))] for r in chunk]
            lp = sequences_logprob(model, seqs, [len(r[2]) for r in chunk], pad, [r[4] for r in chunk])
            tokens = sum(len(s) - len(r[2]) for s, r in zip(seqs, chunk, strict=True))
            loss = -lp.sum() / tokens
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
        out.append({"policy": f"supervised, epoch {epoch}", "loss": float(np.mean(losses)),
                    **score(model, test, moves, replies, pad), "seconds": time.perf_counter() - start})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=list(GAMES), default="frozenlake")
    parser.add_argument("--batches", type=int, default=40, help="random-play batches (the config's groups x episodes)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoints", nargs="*", type=Path, default=[], help="model directories to score as well")
    parser.add_argument("--quick", action="store_true", help="smoke size: 3 batches of 2x2, 1 epoch, 1 warm-start step")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/ceiling[-GAME].json")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. model=tiny-vl "
                        "rollout.manager.observation=image (the board from pixels)")
    args = parser.parse_args()
    overrides = list(args.overrides)
    if args.quick:
        args.batches, args.epochs = 3, 1
        overrides += ["rollout.num_groups=2", "rollout.group_size=2", "sft.steps=1", "sft.batch_episodes=2"]
    import torch

    from arl.models.tiny_vl import auto_model_class

    torch.manual_seed(0)
    started = time.perf_counter()
    rows, replies, model, (warm_model, warm, pad) = asyncio.run(collect(args.game, args.batches, overrides))
    moves = sorted(replies)
    split = max(1, int(args.batches * 0.8))
    train = [r for r in rows if r[0] < split]
    seen = {r[1] for r in train}
    test = list({r[1]: r for r in rows if r[0] >= split and r[1] not in seen}.values())
    if not train or not test:
        raise SystemExit(f"too few labelled states ({len(train)} train, {len(test)} held out): raise --batches")
    counts = collections.Counter(m for r in train for m in r[3])
    common = max(counts, key=counts.get)
    results = [
        {"policy": "chance (uniform over 4 moves)", "accuracy": float(np.mean([len(r[3]) / 4 for r in test])),
         "p_optimal": float(np.mean([len(r[3]) / 4 for r in test]))},
        {"policy": f"always {common} (most common optimal move)", "accuracy": float(np.mean([common in r[3] for r in test])),
         "p_optimal": float("nan")},
        {"policy": f"format warm-start only ({warm['sft/steps']:.0f} steps)", **score(warm_model, test, moves, replies, pad)},
        *supervised(model, train, test, moves, replies, pad, args.epochs, seed=0),
    ]
    for path in args.checkpoints:
        trained = auto_model_class(path).from_pretrained(path, dtype=torch.float32)
        results.append({"policy": f"checkpoint {path}", **score(trained, test, moves, replies, pad)})
    print(f"\n{args.game}: {len(train)} training states ({len(seen)} distinct) from {split} batches, "
          f"{len(test)} held-out distinct states from {args.batches - split} batches\n")
    print(table(["policy", "held-out accuracy", "p(optimal)", "train loss", "s"],
                [[r["policy"], f"{r['accuracy']:.3f}", "-" if np.isnan(r["p_optimal"]) else f"{r['p_optimal']:.3f}",
                  f"{r['loss']:.3f}" if "loss" in r else "-", f"{r['seconds']:.0f}" if "seconds" in r else "-"]
                 for r in results]))
    out = args.out or (result_path("ceiling" if args.game == "frozenlake" else f"ceiling-{args.game}", args.quick))
    write_result(out, args, {"game": args.game, "train_states": len(train), "test_states": len(test),
                             "rows": results}, started)


if __name__ == "__main__":
    main()
