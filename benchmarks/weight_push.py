"""Weight push per training step, full model vs LoRA adapter: bytes moved and seconds, per model.

    .venv/bin/python benchmarks/weight_push.py                 # tiny + SmolLM2-135M, vllm
    .venv/bin/python benchmarks/weight_push.py --quick         # smoke size: tiny, 3 pushes each (~1 min)
    .venv/bin/python benchmarks/weight_push.py --backends vllm vllm-async hf --models tiny

What a trainer step pushes after its update (`Trainer.push_weights`): without LoRA every tensor of
the state dict through `update_weights` (vLLM: `reload_weights` + a prefix-cache reset); with LoRA
the adapter through `update_adapter` (its peft state dict copied out of the model, written as a
peft directory, registered under a new LoRA id). Each push is timed from the trainer's side, the
copy out of the model included, with the adapter's B matrices changed before each LoRA push so
every push is a new policy. Full pushes run on an engine started without LoRA, adapter pushes on
one started with it (vLLM must know at start-up). Bytes are what the push hands the engine (a tied
embedding counts twice, as the state dict names it twice). Per (model, backend, mode): median
seconds (min-max) over `--pushes`, the first push of each kind left out as warm-up. Also the
decode throughput the served adapter costs (vLLM's LoRA kernels run on every token): 16 seeded
sequences of 32 tokens, base weights vs adapter, median of 3.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import cell, quiet_logs, result_path, summary, table, write_result  # noqa: E402

quiet_logs()

RANKS = {"tiny": 8, "smollm2-135m": 16}  # the LoRA twins' ranks (configs/*_lora.yaml)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for _, t in tensors)


async def _decode_s(engine, prompt: list[int]) -> float:
    """Seconds for 16 concurrent seeded 32-token completions (median of 3)."""
    from arl.engine import SamplingParams

    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        await asyncio.gather(*[engine.generate(prompt, SamplingParams(max_tokens=32, ignore_eos=True, seed=i))
                               for i in range(16)])
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def measure(model_name: str, backend: str, pushes: int) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    from arl.config import LoRAConfig
    from arl.engine import make_engine
    from arl.engine.vllm_lora import lora_engine_args
    from arl.models import resolve_model
    from arl.train import lora

    rank = RANKS[model_name]
    path = resolve_model(model_name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = []
    for mode in ("full", "lora"):
        extra = lora_engine_args(rank) if mode == "lora" and backend.startswith("vllm") else {}
        engine = make_engine(backend=backend, model=model_name, max_model_len=1024,
                             kv_cache_memory_bytes=128 * 2**20, extra=extra)
        prompt = list(range(5, 200))
        try:
            if mode == "lora":
                model = lora.wrap(model, LoRAConfig(rank=rank))
            times, nbytes = [], 0
            for k in range(pushes + 1):
                t0 = time.perf_counter()
                if mode == "full":
                    state = [(n, t.detach()) for n, t in model.state_dict().items()]
                    await engine.update_weights(state)
                    nbytes = _nbytes(state)
                else:
                    with torch.no_grad():  # a new policy each push, as after an update
                        for name, p in model.named_parameters():
                            if ".lora_B." in name:
                                p.normal_(0, 1e-3)
                    adapter = lora.adapter_of(model)
                    await engine.update_adapter(adapter)
                    nbytes = adapter.nbytes
                if k:  # the first push is a warm-up
                    times.append(time.perf_counter() - t0)
            decode = await _decode_s(engine, prompt) if backend != "hf" else None
        finally:
            await engine.close()
        rows.append({"model": model_name, "backend": backend, "mode": mode, "rank": rank if mode == "lora" else None,
                     "bytes": nbytes, "push_s": summary(times), "decode_16x32_s": decode})
        print(f"  {model_name} {backend} {mode}: {nbytes / 1e6:.2f} MB, push {cell(summary(times), '{:.1f}', 1e3)} ms",
              flush=True)
    return rows


async def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    for model_name in args.models:
        for backend in args.backends:
            rows += await measure(model_name, backend, args.pushes)
    return rows


def report(rows: list[dict]) -> str:
    out = []
    for r in rows:
        full = next(x for x in rows if x["model"] == r["model"] and x["backend"] == r["backend"] and x["mode"] == "full")
        out.append([r["model"], r["backend"], r["mode"] + (f" r={r['rank']}" if r["rank"] else ""),
                    f"{r['bytes'] / 1e6:.3f}", f"{full['bytes'] / r['bytes']:.0f}x",
                    cell(r["push_s"], "{:.1f}", 1e3),
                    "–" if r["decode_16x32_s"] is None else f"{r['decode_16x32_s']:.2f}"])
    return table(["model", "backend", "push", "MB per push", "less than full", "push ms, median (min–max)",
                  "decode 16x32 tokens, s"], out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(RANKS), default=None,
                        help="default: tiny smollm2-135m (--quick: tiny)")
    parser.add_argument("--backends", nargs="+", choices=["vllm", "vllm-async", "hf"], default=["vllm"])
    parser.add_argument("--pushes", type=int, default=None, help="timed pushes per mode (default 10; --quick 3)")
    parser.add_argument("--quick", action="store_true", help="smoke size: tiny, 3 pushes per mode")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/weight_push.json")
    args = parser.parse_args()
    args.models = args.models or (["tiny"] if args.quick else list(RANKS))
    args.pushes = args.pushes or (3 if args.quick else 10)
    started = time.perf_counter()
    rows = asyncio.run(run(args))
    print(report(rows))
    write_result(args.out or result_path("weight_push", args.quick), args, {"rows": rows}, started)


if __name__ == "__main__":
    main()
