"""A training step beside its compute floor: the step's FLOPs at the matmul rate of this machine.

    .venv/bin/python benchmarks/step_floor.py                   # SmolLM2-135M config, 3 steps (3 min for 4 steps in bf16 on 2 idle AVX512-BF16 cores, 2026-12-04; ~15 min in fp32 on AVX2)
    .venv/bin/python benchmarks/step_floor.py --quick           # tiny model, 1 step of 2x2 episodes (~1-2 min)
    .venv/bin/python benchmarks/step_floor.py --config configs/smollm2_frozenlake_gigpo.yaml --steps 4 \
        optim.precision=bf16 engine.dtype=bfloat16              # any config + dotted overrides (as `arl train`)

One run measures both sides (issue 27, item 3):

- the machine's rate: square `torch.matmul` of `--matmul-size` (2048 on CPU, 8192 on CUDA) in fp32
  and bf16, `--matmul-warmup` untimed calls and the median TFLOP/s (2 n^3 flops per call) of
  `--matmul-repeats` timed ones, with torch's default threads, within about `--matmul-budget-s`
  per dtype (a slower dtype gets a smaller size and fewer calls: bf16 on a CPU without bf16
  instructions); once before the trainer is built and once after its steps. The floor uses the
  higher of the two medians (the stricter floor: on a shared machine the lower one is the other
  tenants' doing).
- the step: the config with the overrides given and no format warm-start, no evaluation, no
  checkpoint (sft.steps=0, eval.at_start=false, eval.every=0, save_every=0, and `steps` set one
  past `--steps`, since the trainer evaluates and saves at the run's last step), `--steps` real
  `Trainer.step()` calls; the first `--warmup` (default 1) are left out of the medians where
  more steps ran (first backward pass, allocator growth).

Per step, from the step's own metrics, with N = the parameters of the trainer's Hugging Face model
(`model.parameters()`: tied embeddings once, a LoRA adapter included):

    rollout tokens  = rollout/num_turns x (rollout/prompt_tokens_mean + rollout/response_tokens_mean)
    trained tokens  = train/num_samples x rollout/sample_tokens_mean
    rollout floor   = 2 N x rollout tokens / rate(engine.dtype)
    update floor    = passes N x trained tokens / rate(optim.precision)
    passes          = epochs x 6 (forward 2 + backward 4; 4 under LoRA: no weight gradients of the
                      frozen base) + 2 if algo.kl_coef > 0 (the reference model's forward)
                      + 2 if optim.mini_batches > 1 or optim.epochs > 1 (the old-policy forward
                      `update.py` runs then; one optimizer step per batch skips it)

bf16 rate where the engine runs in bfloat16 (rollout) or optim.precision is bf16 (update), else
fp32. A second rollout row subtracts the prompt tokens vLLM's prefix cache served
(rollout/prefix_cache_hit_rate x rollout/prefix_cache_query_tokens): what the engine had to
compute at least. Advantages, weight push and canary have no matmul floor worth the name; they are
shown measured only, and the step's floor is rollout + update. "x floor" is the median over the
measured steps of each step's measured / floor. Not in the floor: attention's own FLOPs (short
contexts here), padding inside a micro-batch, gradient checkpointing's recompute, and that decode
on a CPU is bound by memory bandwidth rather than by matmul rate (one pass over the weights per
engine step, whatever the batch). Writes results/step_floor.json (--quick: the git-ignored
results/step_floor-quick.tmp).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _util import cell, machine, quiet_logs, result_path, summary, table, write_result  # noqa: E402

quiet_logs()

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "configs" / "smollm2_frozenlake_gigpo.yaml"
QUICK_CONFIG = REPO / "configs" / "tiny_frozenlake_gigpo.yaml"
DEFAULT_OVERRIDES = ["sft.steps=0", "eval.at_start=false", "eval.every=0", "save_every=0", "tensorboard=false",
                     "keep_checkpoints=1"]
QUICK_OVERRIDES = ["rollout.num_groups=2", "rollout.group_size=2", "engine.kv_cache_memory_bytes=134217728"]
# phase -> the trainer's timing metric; measured only unless it has a floor (rollout, update)
PHASES = {"rollout": "timing/rollout_s", "advantages": "timing/advantages_s", "update": "timing/update_s",
          "weight push": "timing/weight_push_s", "canary": "timing/canary_s",
          "engine sleep": "timing/engine_sleep_s", "engine wake": "timing/engine_wake_s"}
BF16_NAMES = {"bfloat16", "bf16"}
LD_PRELOAD = os.environ.get("LD_PRELOAD", "")  # at start: vLLM's CPU platform rewrites it for its children
# table rows with a floor: phase -> (label, key of `floor_seconds`)
FLOOR_ROWS = {"rollout": [("rollout", "rollout"), ("rollout, prefix-cache hits excluded", "rollout_uncached")],
              "update": [("update", "update")], "step": [("step (floor: rollout + update)", "step")]}


# -- the floor (pure: tested in tests/test_benchmarks_step_floor.py) ------------------------------------
def update_passes(*, lora: bool, epochs: int, mini_batches: int, kl_coef: float) -> int:
    """FLOPs of the update per trained token, in units of N (the parameter count): forward and
    backward of every epoch (6; 4 under LoRA, whose frozen base gets no weight gradients), the
    reference forward under a KL term (2), the old-policy forward `update.py` runs unless the batch
    is one optimizer step (2).

    >>> update_passes(lora=False, epochs=1, mini_batches=1, kl_coef=0.5)
    8
    >>> update_passes(lora=True, epochs=2, mini_batches=1, kl_coef=0.0)
    10
    """
    per_epoch = 4 if lora else 6
    return epochs * per_epoch + (2 if kl_coef > 0 else 0) + (2 if mini_batches > 1 or epochs > 1 else 0)


def step_tokens(m: dict[str, float]) -> dict[str, float]:
    """Rollout tokens (every prompt and response token of every turn), the same less the prompt
    tokens the prefix cache served, and trained tokens (the update's rows, real tokens, no padding)."""
    turns = m.get("rollout/num_turns", 0.0)
    prompt = turns * m.get("rollout/prompt_tokens_mean", 0.0)
    response = turns * m.get("rollout/response_tokens_mean", 0.0)
    hits = m.get("rollout/prefix_cache_hit_rate", 0.0) * m.get("rollout/prefix_cache_query_tokens", 0.0)
    trained = m.get("train/num_samples", 0.0) * m.get("rollout/sample_tokens_mean", 0.0)
    return {"rollout": prompt + response, "rollout_uncached": max(prompt - hits, 0.0) + response,
            "trained": trained}


def floor_seconds(m: dict[str, float], n_params: int, *, rollout_flops_per_s: float, update_flops_per_s: float,
                  passes: int) -> dict[str, float]:
    """Seconds the step's matmuls need at the given rates: 2 N per rollout token, ``passes`` N per
    trained token; ``step`` = rollout + update.

    >>> m = {"rollout/num_turns": 10, "rollout/prompt_tokens_mean": 40, "rollout/response_tokens_mean": 10,
    ...      "train/num_samples": 10, "rollout/sample_tokens_mean": 50}
    >>> floor_seconds(m, 1000, rollout_flops_per_s=1e6, update_flops_per_s=1e6, passes=6)["step"]
    4.0
    """
    tokens = step_tokens(m)
    rollout = 2 * n_params * tokens["rollout"] / rollout_flops_per_s
    update = passes * n_params * tokens["trained"] / update_flops_per_s
    return {"rollout": rollout, "rollout_uncached": 2 * n_params * tokens["rollout_uncached"] / rollout_flops_per_s,
            "update": update, "step": rollout + update}


# -- the machine's matmul rate -------------------------------------------------------------------------
def matmul_rate(dtype_name: str, size: int, warmup: int, repeats: int, device: str,
                budget_s: float | None = None) -> dict[str, float]:
    """TFLOP/s of one (size x size) @ (size x size) matmul: summary over ``repeats`` timed calls,
    after ``warmup`` untimed ones. Where one call would take more than a quarter of ``budget_s``
    (bf16 on a CPU without bf16 instructions runs ~50x slower than fp32), the size halves (down to
    256) and then the calls shrink to 1 warm-up and as many timed ones as fit, at least 3; the
    size used is in the summary."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    while True:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
        t0 = time.perf_counter()
        torch.matmul(a, b)  # the first warm-up call, timed to fit the budget
        sync()
        first = time.perf_counter() - t0
        if budget_s is None or first * 4 <= budget_s or size <= 256:
            break
        size //= 2
    if budget_s is not None and first * (warmup + repeats) > budget_s:
        warmup, repeats = 1, max(3, int(budget_s / first) - 1)
    for _ in range(warmup - 1):
        torch.matmul(a, b)
    sync()
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync()
        rates.append(2 * size**3 / (time.perf_counter() - t0) / 1e12)
    return {**summary(rates), "size": size}


def measure_rates(args: argparse.Namespace, device: str, when: str) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    for dtype in ("fp32", "bf16"):
        out[dtype] = matmul_rate(dtype, args.matmul_size, args.matmul_warmup, args.matmul_repeats, device,
                                 args.matmul_budget_s)
    print(f"matmul {when} (torch threads {out['torch_threads']}): " + ", ".join(
        f"{d} {out[d]['median']:.4f} TFLOP/s at {out[d]['size']}^2 x{out[d]['n']}" for d in ("fp32", "bf16")),
        flush=True)
    return out


# -- the run -------------------------------------------------------------------------------------------
async def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from arl.config import load_config
    from arl.train import Trainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rates_before = measure_rates(args, device, "before")
    out_dir = tempfile.mkdtemp(prefix="arl-bench-step-floor-")
    # steps one past those run: the trainer evaluates and checkpoints at the run's last step
    overrides = [*DEFAULT_OVERRIDES, f"out_dir={out_dir}", "name=bench_step_floor", *args.overrides,
                 f"steps={args.steps + 1}"]
    config = load_config(args.config, overrides)
    if config.rollout.max_staleness > 0:
        print("note: rollout.max_staleness > 0: timing/rollout_s is the wait for a batch collected during "
              "the previous update, not the rollout's own time", flush=True)
    history: list[dict[str, float]] = []
    try:
        async with Trainer(config) as trainer:
            t0 = time.perf_counter()
            await trainer.setup()
            setup_s = time.perf_counter() - t0
            threads_after_setup = torch.get_num_threads()
            print(f"setup (engine start, model load) {setup_s:.1f} s; torch threads {threads_after_setup}", flush=True)
            model = trainer.model
            n_params = sum(p.numel() for p in model.parameters())
            embedding = model.get_input_embeddings().weight.numel()
            tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
            for i in range(args.steps):
                m = await trainer.step()
                history.append({k: float(v) for k, v in m.items() if isinstance(v, int | float)})
                tokens = step_tokens(m)
                print(f"  step {i + 1}: " + ", ".join(f"{p} {m[k]:.2f} s" for p, k in PHASES.items() if k in m)
                      + f", step {m['timing/step_s']:.2f} s; {tokens['rollout']:.0f} rollout tokens, "
                      f"{tokens['trained']:.0f} trained tokens", flush=True)
            train_device = str(trainer.device)
            config = trainer.config  # optim.precision "auto" / engine.dtype "policy" as resolved
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    rates_after = measure_rates(args, device, "after")
    return {"config": config, "history": history, "n_params": n_params, "embedding_params": embedding,
            "tied_embeddings": tied, "setup_s": setup_s, "rates_before": rates_before, "rates_after": rates_after,
            "torch_threads_after_setup": threads_after_setup, "device": device, "train_device": train_device}


def ratio_text(r: float) -> str:
    return f"{r:.1f}x" if r < 100 else f"{r:.0f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help=f"default: {DEFAULT_CONFIG.relative_to(REPO)} "
                        f"(--quick: {QUICK_CONFIG.relative_to(REPO)})")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians (if more ran)")
    parser.add_argument("--matmul-size", type=int, default=None, help="default: 2048 on CPU, 8192 on CUDA")
    parser.add_argument("--matmul-warmup", type=int, default=3)
    parser.add_argument("--matmul-repeats", type=int, default=7)
    parser.add_argument("--matmul-budget-s", type=float, default=20.0,
                        help="seconds one dtype's measurement may take about (smaller size / fewer calls past it)")
    parser.add_argument("--quick", action="store_true", help="smoke size: the tiny config, 1 step of 2x2 episodes")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/step_floor.json")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. optim.precision=bf16")
    args = parser.parse_args()
    if args.quick:
        args.config = args.config or str(QUICK_CONFIG)
        args.steps = 1
        args.matmul_size = args.matmul_size or 1024
        args.matmul_repeats = min(args.matmul_repeats, 5)
        args.matmul_budget_s = min(args.matmul_budget_s, 4.0)
        args.overrides = [*QUICK_OVERRIDES, *args.overrides]
    args.config = args.config or str(DEFAULT_CONFIG)
    if args.matmul_size is None:
        import torch

        args.matmul_size = 8192 if torch.cuda.is_available() else 2048
    started = time.perf_counter()
    r = asyncio.run(run(args))
    config, history, n = r["config"], r["history"], r["n_params"]

    rates = {d: max(r["rates_before"][d]["median"], r["rates_after"][d]["median"]) * 1e12 for d in ("fp32", "bf16")}
    rollout_dtype = "bf16" if config.engine.dtype in BF16_NAMES else "fp32"
    update_dtype = "bf16" if config.optim.precision == "bf16" else "fp32"
    lora = config.lora.rank > 0
    passes = update_passes(lora=lora, epochs=config.optim.epochs, mini_batches=config.optim.mini_batches,
                           kl_coef=config.algo.kl_coef)
    steps = []
    for m in history:
        floor = floor_seconds(m, n, rollout_flops_per_s=rates[rollout_dtype], update_flops_per_s=rates[update_dtype],
                              passes=passes)
        measured = {p: m[k] for p, k in PHASES.items() if k in m}
        measured["other"] = m["timing/step_s"] - sum(measured.values())
        measured["step"] = m["timing/step_s"]
        steps.append({"measured": measured, "floor": floor, "tokens": step_tokens(m),
                      "samples": m.get("train/num_samples", 0.0), "rollout_samples": m.get("rollout/num_samples", 0.0),
                      "turns": m.get("rollout/num_turns", 0.0),
                      "prefix_cache_hit_rate": m.get("rollout/prefix_cache_hit_rate"),
                      "engine_busy_frac": m.get("rollout/engine_busy_frac"), "metrics": m})
    measured_steps = steps[args.warmup:] if len(steps) > args.warmup else steps

    def med(fn: Any) -> float:
        return statistics.median(fn(s) for s in measured_steps)

    rows, phases = [], {}
    for phase in [*PHASES, "other", "step"]:
        if phase not in measured_steps[0]["measured"]:
            continue
        s = summary([st["measured"][phase] for st in measured_steps])
        entry: dict[str, Any] = {"measured_s": s}
        if phase not in FLOOR_ROWS:
            rows.append([phase, cell(s, "{:.3f}"), "-", "-"])
        for label, key in FLOOR_ROWS.get(phase, []):
            f = med(lambda st, key=key: st["floor"][key])
            ratio = med(lambda st, key=key, phase=phase: st["measured"][phase] / st["floor"][key]
                        if st["floor"][key] > 0 else float("inf"))
            entry[key] = {"floor_s": f, "ratio": ratio}
            rows.append([label, cell(s, "{:.3f}"), f"{f:.3g}", ratio_text(ratio)])
        phases[phase] = entry

    import torch

    cpu = machine()["cpu"]
    device_text = torch.cuda.get_device_name(0) if r["device"] == "cuda" else f"CPU ({cpu}, {os.cpu_count()} cores)"
    tokens = {k: med(lambda st, k=k: st["tokens"][k]) for k in ("rollout", "rollout_uncached", "trained")}
    print(f"\n{Path(args.config).name} + {' '.join([*DEFAULT_OVERRIDES, *args.overrides])}; "
          f"{len(measured_steps)} measured step(s)" + (f" after {args.warmup} warm-up" if len(steps) > args.warmup
                                                       else " (warm-up included)") + " (median, min–max)")
    print(f"device: {device_text}; trainer on {r['train_device']}; torch threads {r['rates_before']['torch_threads']} "
          f"(after set-up {r['torch_threads_after_setup']}); LD_PRELOAD at start {LD_PRELOAD or '(none)'}")
    print(f"model {config.model}: N = {n:,} parameters ({r['embedding_params']:,} embedding, "
          f"{'tied' if r['tied_embeddings'] else 'untied'}); {'LoRA rank ' + str(config.lora.rank) if lora else 'full fine-tuning'}")
    print(f"matmul rate used (higher of before/after): fp32 {rates['fp32'] / 1e12:.4g}, bf16 {rates['bf16'] / 1e12:.4g} "
          f"TFLOP/s; rollout at {rollout_dtype} (engine.dtype={config.engine.dtype}), update at {update_dtype} "
          f"(optim.precision={config.optim.precision}), {passes} N per trained token")
    print(f"per step: {tokens['rollout']:.0f} rollout tokens ({tokens['rollout_uncached']:.0f} not served by the prefix "
          f"cache), {tokens['trained']:.0f} trained tokens")
    print(table(["phase", "measured s", "floor s", "x floor"], rows))
    faster = max(rates, key=rates.get)
    for phase, dtype in (("rollout", rollout_dtype), ("update", update_dtype)):
        if dtype != faster:
            print(f"note: the {phase} computes in {dtype}, {rates[faster] / rates[dtype]:.1f}x slower than {faster} "
                  f"matmuls on this machine: its floor is at the {dtype} rate, not the machine's best")
    mismatch = [st for st in steps if st["samples"] != st["rollout_samples"]]
    if mismatch:
        print(f"note: {len(mismatch)} step(s) trained fewer samples than the rollout made (samples without response "
              "tokens dropped): trained tokens use the rollout's mean sample length, an approximation")
    payload = {"config": args.config, "overrides": [*DEFAULT_OVERRIDES, *args.overrides], "model": config.model,
               "n_params": n, "embedding_params": r["embedding_params"], "tied_embeddings": r["tied_embeddings"],
               "lora": lora, "passes_per_trained_token": passes, "rollout_dtype": rollout_dtype,
               "update_dtype": update_dtype, "device": device_text, "train_device": r["train_device"],
               "torch_threads": r["rates_before"]["torch_threads"],
               "torch_threads_after_setup": r["torch_threads_after_setup"],
               "ld_preload": LD_PRELOAD, "setup_s": r["setup_s"],
               "matmul": {"size": args.matmul_size, "before": r["rates_before"], "after": r["rates_after"],
                          "used_tflops": {d: v / 1e12 for d, v in rates.items()}},
               "tokens_per_step": tokens, "phases": phases, "steps": steps, "warmup": args.warmup}
    write_result(args.out or result_path("step_floor", args.quick), args, payload, started)


if __name__ == "__main__":
    main()
