"""Overlapped vs synchronous training steps: the demo's step time in both modes, A/B in one run.

    .venv/bin/python benchmarks/overlap.py                 # demo config, 2 rounds x (sync, overlap) (~6 min on 2 cores)
    .venv/bin/python benchmarks/overlap.py --quick         # smoke size (~1 min)
    .venv/bin/python benchmarks/overlap.py --rounds 3 --steps 16 rollout.num_groups=16
    .venv/bin/python benchmarks/overlap.py --contention    # why: a tiny-model update beside a Python thread / a busy core
    .venv/bin/python benchmarks/overlap.py --cores         # the floor: each phase with 1 and 2 threads (~3 min)

Each round trains the config twice from its format warm-start on one shared engine: synchronous
(``rollout.max_staleness=0``: rollout, then update) and overlapped (``=1``: the next step's rollout
runs during this step's update, one version behind), in that order; rounds repeat the pair, so
the two modes alternate on the same (noisy, shared) machine. Per run: the median of
timing/step_s over the steps after the first (its rollout cannot overlap anything) and before
the last (which also evaluates), and the medians of the rollout wait and the update. Per round:
overlap / sync of those medians; the table shows every round and the median ratio. The goal
(issue 14): overlap <= 0.6x sync on the demo; on 2 cores the floor is max(rollout, update) /
(rollout + update).

``--cores`` asks how much overlap could win at all: it trains the config synchronously in a child
process with 2 threads and again with 1 (OMP_NUM_THREADS, the `arl` command's tcmalloc + Intel
OpenMP preload), and reports per phase the wall seconds and the cores it kept busy (process CPU
seconds / wall). Overlap on 2 cores gives each phase one core at best, so its step cannot be
shorter than max(rollout on 1 core, update on 1 core), while the synchronous step gets both cores
in each phase: floor = max(r1, u1) / (r2 + u2).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import quiet_logs, result_path, table, write_result  # noqa: E402

quiet_logs()

REPO = Path(__file__).resolve().parent.parent
MODES = {"sync": "rollout.max_staleness=0", "overlap": "rollout.max_staleness=1"}
RUN_OVERRIDES = ["eval.at_start=false", "eval.every=0", "eval.num_seeds=8", "tensorboard=false",
                 "keep_checkpoints=1"]
QUICK_OVERRIDES = ["rollout.num_groups=2", "rollout.group_size=4", "sft.steps=2",
                   "engine.kv_cache_memory_bytes=134217728"]


async def run(args: argparse.Namespace) -> list[dict]:
    from arl.config import load_config
    from arl.engine import make_engine
    from arl.train import Trainer

    base = [*RUN_OVERRIDES, *(QUICK_OVERRIDES if args.quick else []), f"steps={args.steps}", *args.overrides]
    out = Path(tempfile.mkdtemp(prefix="arl-bench-overlap-"))
    engine = make_engine(load_config(args.config, base).engine)
    runs = []
    try:
        for r in range(args.rounds):
            for mode, override in MODES.items():
                config = load_config(args.config, [*base, override, f"out_dir={out}", f"name={mode}-{r}"])
                async with Trainer(config, engine=engine) as trainer:
                    history = await trainer.train()
                steps = [row for row in history if "timing/step_s" in row][1:-1]
                run = {"round": r, "mode": mode, "steps": len(steps),
                       "step_s": statistics.median(row["timing/step_s"] for row in steps),
                       "rollout_wait_s": statistics.median(row["timing/rollout_s"] for row in steps),
                       "update_s": statistics.median(row["timing/update_s"] for row in steps),
                       "staleness_mean": statistics.fmean(row.get("train/staleness_mean", 0.0) for row in steps),
                       "all_step_s": [row["timing/step_s"] for row in steps]}
                runs.append(run)
                print(f"  round {r} {mode}: step {run['step_s']:.2f} s (rollout wait {run['rollout_wait_s']:.2f}, "
                      f"update {run['update_s']:.2f}), staleness {run['staleness_mean']:.2f}", flush=True)
    finally:
        await engine.close()
    return runs


def _busy(stop) -> None:  # a pure-Python loop: holds the GIL whenever it runs
    x = 0
    while not stop.is_set():
        x += 1


def contention(repeats: int = 5) -> list[dict]:
    """Median seconds of 3 tiny-model update steps (64 x 48 tokens) alone, beside a pure-Python
    thread (competes for the GIL), and beside a busy process (competes for a core only), with
    1 and 2 torch threads: which resource an update shares with a rollout in the same process."""
    import multiprocessing as mp
    import threading

    import torch
    from transformers import AutoModelForCausalLM

    from arl.models import resolve_model

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (64, 48))
    opt = torch.optim.AdamW(model.parameters(), 1e-4)

    def update() -> float:
        t = time.perf_counter()
        for _ in range(3):
            model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
        return time.perf_counter() - t

    def beside(start, stop_event) -> float:
        worker = start(stop_event)
        time.sleep(0.3)
        try:
            return statistics.median(update() for _ in range(repeats))
        finally:
            stop_event.set()
            worker.join()

    def thread(stop):
        t = threading.Thread(target=_busy, args=(stop,))
        t.start()
        return t

    def process(stop):
        p = mp.get_context("spawn").Process(target=_busy, args=(stop,))
        p.start()
        return p

    update()
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        alone = statistics.median(update() for _ in range(repeats))
        stop_t = threading.Event()
        with_thread = beside(thread, stop_t)
        stop_p = mp.get_context("spawn").Event()
        with_proc = beside(process, stop_p)
        rows.append({"torch_threads": threads, "alone_s": alone, "python_thread_s": with_thread,
                     "busy_process_s": with_proc})
    print(table(["torch threads", "update alone", "+ a Python thread (GIL)", "+ a busy process (one core)"],
                [[r["torch_threads"], f"{r['alone_s']:.3f} s", f"{r['python_thread_s']:.3f} s "
                  f"({r['python_thread_s'] / r['alone_s']:.2f}x)", f"{r['busy_process_s']:.3f} s "
                  f"({r['busy_process_s'] / r['alone_s']:.2f}x)"] for r in rows]))
    return rows


CORES_WORKER = r"""
import asyncio, json, statistics, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from _util import quiet_logs
quiet_logs()
from arl.config import load_config
from arl.train import Trainer

async def main():
    config = load_config(sys.argv[2], [*json.loads(sys.argv[3]), f"out_dir={tempfile.mkdtemp()}"])
    phases = {"rollout": [], "update": [], "step": []}
    async with Trainer(config) as trainer:
        await trainer.setup()
        rollout, update = trainer._rollout, trainer.update
        async def timed_rollout(step):
            wall, cpu = time.perf_counter(), time.process_time()
            batch = await rollout(step)
            phases["rollout"].append((time.perf_counter() - wall, time.process_time() - cpu))
            return batch
        def timed_update(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            metrics = update(*args, **kwargs)
            phases["update"].append((time.perf_counter() - wall, time.process_time() - cpu))
            return metrics
        trainer._rollout, trainer.update = timed_rollout, timed_update
        step = trainer.step
        async def timed_step():
            wall, cpu = time.perf_counter(), time.process_time()
            metrics = await step()
            phases["step"].append((time.perf_counter() - wall, time.process_time() - cpu))
            return metrics
        trainer.step = timed_step
        await trainer.train()  # the format warm-start first, as the demo
    out = {}
    for name, rows in phases.items():
        rows = rows[1:]  # the first step warms up
        out[name] = {"wall_s": statistics.median(r[0] for r in rows), "cpu_s": statistics.median(r[1] for r in rows),
                     "cores": statistics.median(r[1] / r[0] for r in rows)}
    print("@@" + json.dumps(out), flush=True)

asyncio.run(main())
"""


def cores(args: argparse.Namespace) -> dict:
    """Each phase's wall seconds and busy cores, synchronous training with 2 threads and with 1."""
    import json
    import os
    import subprocess

    from arl.cli import preload_libraries

    overrides = [*RUN_OVERRIDES, *(QUICK_OVERRIDES if args.quick else []), f"steps={args.steps}",
                 "rollout.max_staleness=0", *args.overrides]
    result = {}
    for threads in (2, 1):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads),
               "LD_PRELOAD": ":".join(preload_libraries()), "ARL_PRELOADED": "1"}
        proc = subprocess.run([sys.executable, "-c", CORES_WORKER, str(Path(__file__).parent), args.config,
                               json.dumps(overrides)], env=env, capture_output=True, text=True, check=True)
        line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
        result[threads] = json.loads(line[2:])
        print(f"  {threads} thread(s): " + ", ".join(f"{k} {v['wall_s']:.2f} s ({v['cores']:.2f} cores)"
                                                   for k, v in result[threads].items()), flush=True)
    r1, u1 = result[1]["rollout"]["wall_s"], result[1]["update"]["wall_s"]
    r2, u2 = result[2]["rollout"]["wall_s"], result[2]["update"]["wall_s"]
    floor = max(r1, u1) / (r2 + u2)
    rows = [[t, *(f"{result[t][k]['wall_s']:.2f} s ({result[t][k]['cores']:.2f})" for k in ("rollout", "update", "step"))]
            for t in (2, 1)]
    print(f"\n{Path(args.config).name} + {' '.join(args.overrides) or '(no overrides)'}, synchronous, "
          f"{args.steps} steps after the warm-start, medians over steps 2-{args.steps}: seconds (cores busy)")
    print(table(["threads", "rollout", "update", "step"], rows))
    print(f"overlap floor on 2 cores: max(rollout 1 thread, update 1 thread) / (rollout + update, 2 threads) = "
          f"max({r1:.2f}, {u1:.2f}) / ({r2:.2f} + {u2:.2f}) = {floor:.2f}x (goal <= 0.6x)")
    return {"threads": result, "floor": floor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny_frozenlake_gigpo.yaml"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="smoke size: 1 round of 4 steps of 2x4 episodes")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/overlap.json")
    parser.add_argument("--contention", action="store_true",
                        help="only the contention probe: an update beside a Python thread / a busy process")
    parser.add_argument("--cores", action="store_true",
                        help="only the floor: each phase's seconds and busy cores with 2 threads and with 1")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every run")
    args = parser.parse_args()
    if args.cores:
        if args.quick:
            args.steps = 3
        started = time.perf_counter()
        write_result(args.out or result_path("overlap-cores", args.quick), args, cores(args), started)
        return
    if args.contention:
        started = time.perf_counter()
        rows = contention()
        write_result(args.out or result_path("overlap-contention", args.quick), args, {"rows": rows}, started)
        return
    if args.quick:
        args.rounds, args.steps = 1, 4
    started = time.perf_counter()
    runs = asyncio.run(run(args))
    rows, ratios = [], []
    for r in range(args.rounds):
        sync, lap = (next(x for x in runs if x["round"] == r and x["mode"] == m) for m in MODES)
        ratio = lap["step_s"] / sync["step_s"]
        ratios.append(ratio)
        rows.append([r, f"{sync['step_s']:.2f} ({sync['rollout_wait_s']:.2f} + {sync['update_s']:.2f})",
                     f"{lap['step_s']:.2f} ({lap['rollout_wait_s']:.2f} + {lap['update_s']:.2f})", f"{ratio:.2f}x",
                     f"{lap['staleness_mean']:.2f}"])
    print(f"\n{Path(args.config).name} + {' '.join(args.overrides) or '(no overrides)'}; {args.steps} steps per run, "
          "median step seconds over the steps between the first and the last (rollout wait + update medians)")
    print(table(["round", "sync: step (rollout + update)", "overlap: step (rollout wait + update)",
                 "overlap / sync", "overlap staleness"], rows))
    print(f"median overlap / sync: {statistics.median(ratios):.2f}x (goal <= 0.6x)")
    write_result(args.out or result_path("overlap", args.quick), args,
                 {"runs": runs, "ratios": ratios, "median_ratio": statistics.median(ratios)}, started)


if __name__ == "__main__":
    main()
