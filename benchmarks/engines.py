"""Engine benchmark: start-up, generation throughput by concurrency, weight-update time.

    .venv/bin/python benchmarks/engines.py                 # all backends, full size
    .venv/bin/python benchmarks/engines.py --quick         # CI smoke size
    .venv/bin/python benchmarks/engines.py --backends vllm hf --repeats 5

Throughput = generated tokens / wall time for `concurrency` simultaneous requests of
`--tokens` tokens each (ignore_eos, temperature 1, distinct seeds), median over repeats.
Prints a markdown table and writes benchmarks/results/engines.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path

from arl.engine import SamplingParams, make_engine

RESULTS = Path(__file__).parent / "results" / "engines.json"


async def _throughput(engine, prompt: list[int], concurrency: int, tokens: int, seed: int) -> float:
    params = [SamplingParams(max_tokens=tokens, ignore_eos=True, seed=seed + i) for i in range(concurrency)]
    start = time.perf_counter()
    gens = await asyncio.gather(*[engine.generate(prompt, p) for p in params])
    elapsed = time.perf_counter() - start
    return sum(len(g.token_ids) for g in gens) / elapsed


async def bench_backend(backend: str, args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    engine = make_engine(backend=backend, model=args.model, max_model_len=1024, kv_cache_memory_bytes=256 * 2**20)
    startup = time.perf_counter() - start
    row: dict = {"backend": backend, "startup_s": startup}
    async with engine:
        tok = engine.tokenizer
        ids = tok.apply_chat_template(
            [{"role": "user", "content": "Turn 1:\nObservation:\n#####\n#P_O#\n#__X#\n#####\nDecide:"}],
            add_generation_prompt=True, tokenize=True,
        )
        prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        await _throughput(engine, prompt, 2, 4, seed=0)  # warm-up
        for c in args.concurrency:
            runs = [await _throughput(engine, prompt, c, args.tokens, seed=100 * r) for r in range(args.repeats)]
            row[f"tok_s@{c}"] = statistics.median(runs)
            row[f"tok_s@{c}_spread"] = (min(runs), max(runs))
        if backend != "scripted":
            import torch
            from transformers import AutoModelForCausalLM

            from arl.models import resolve_model

            model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32)
            state = list(model.state_dict().items())
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                await engine.update_weights(state)
                times.append(time.perf_counter() - t0)
            row["update_s"] = statistics.median(times)
    return row


def _fmt(row: dict, concurrency: list[int]) -> str:
    cells = [row["backend"], f"{row['startup_s']:.1f}"]
    for c in concurrency:
        lo, hi = row[f"tok_s@{c}_spread"]
        cells.append(f"{row[f'tok_s@{c}']:.0f} ({lo:.0f}-{hi:.0f})")
    cells.append(f"{row['update_s'] * 1000:.0f}" if "update_s" in row else "-")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["vllm", "vllm-async", "hf", "scripted"])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smoke size: vllm + scripted, few tokens")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.backends = [b for b in args.backends if b in ("vllm", "scripted")]
        args.concurrency, args.tokens, args.repeats = [1, 8], 8, 1

    rows = [asyncio.run(bench_backend(b, args)) for b in args.backends]
    header = ["backend", "start-up s"] + [f"tok/s @{c}" for c in args.concurrency] + ["weight update ms"]
    print(f"model {args.model}, {args.tokens} tokens/request, median of {args.repeats} (min-max)")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print(_fmt(row, args.concurrency))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "python": platform.python_version(), "args": {
        k: v for k, v in vars(args).items() if k != "out"}}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
