"""The README demo before training exists: the tiny model plays groups of games through vLLM.

It exercises the whole rollout path on a fresh machine: build the tiny model, start the
in-process vLLM engine, play G groups x N members of FrozenLake with TrajEnvManager, and show
the rollout metrics and one sample's tokens with the loss mask.
"""

from __future__ import annotations

import argparse
import time

from arl.engine import make_engine
from arl.rollout import GroupScheduler, ManagerConfig, TrajEnvManager


def render_sample(tokenizer, sample, width: int = 100) -> str:
    """The sample's text with engine-generated (loss-masked) spans in [[...]]."""
    out, span, masked = [], [], None
    for tok, m in zip(sample.input_ids, sample.response_mask, strict=True):
        if masked is not None and m != masked:
            text = tokenizer.decode(span)
            out.append(f"[[{text}]]" if masked else text)
            span = []
        span.append(tok)
        masked = m
    text = tokenizer.decode(span)
    out.append(f"[[{text}]]" if masked else text)
    return "".join(out)


async def run_demo(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    engine = make_engine(backend=args.backend, model="tiny", max_model_len=2048)
    print(f"engine {args.backend} on the tiny model ready in {time.perf_counter() - start:.1f} s")
    async with engine:
        manager = TrajEnvManager(engine, ManagerConfig(max_tokens=16, temperature=1.0))
        scheduler = GroupScheduler(args.env, num_groups=args.groups, group_size=args.group_size)
        batch = await scheduler.run(manager, scheduler.specs(step=0))
    print(f"\n{len(batch.episodes)} episodes of {args.env} ({args.groups} groups x {args.group_size}):")
    for key in sorted(batch.metrics):
        print(f"  {key:<40} {batch.metrics[key]:.3f}")
    sample = batch.samples[0]
    print(f"\none sample ({len(sample.input_ids)} tokens, {sample.num_response_tokens} generated, "
          f"score {sample.score:+.2f}); generated spans in [[...]]:\n")
    print(render_sample(engine.tokenizer, sample))
    print(f"\ndone in {time.perf_counter() - start:.1f} s (untrained model: expect invalid answers)")
    return 0
