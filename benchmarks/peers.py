"""Peers side by side: arl's games vs gem-llm's Sokoban and gymnasium's FrozenLake, and one arl
GRPO step vs TRL's GRPOTrainer at the same geometry. Interleaved A/B in one session, ratios.

    .venv/bin/python benchmarks/peers.py envs          # ~3 min on 2 cores (gem's 8x8 resets take seconds each)
    .venv/bin/python benchmarks/peers.py grpo          # ~4 min
    .venv/bin/python benchmarks/peers.py all --quick   # CI smoke size; peers skipped if the venv is missing

The peers are never arl dependencies: they live in a separate benchmark venv (`--peer-python`,
default $ARL_BENCH_PYTHON or /work/bench-venv/bin/python), set up once by hand:

    python3 -m venv /work/bench-venv
    /work/bench-venv/bin/pip install torch==2.13.0+cpu      # the CPU wheel, as arl's own install does
    /work/bench-venv/bin/pip install gem-llm trl gymnasium

arl's side runs in arl's venv (this process, or a child of it); the peer's side runs in a worker
process of the benchmark venv (this file with `--worker gem|trl`, which imports no arl). Both
workers stay up and take commands one line at a time, so the A and B measurements alternate
(A, B, A, B, ...) inside one session and load drift on a shared machine hits both alike.

envs: mean microseconds per reset (a new level every call) and per step (random valid actions,
resets between episodes untimed) for
- arl/Sokoban-v0 (6x6, 1 box) vs gem-llm `game:Sokoban-v0-easy` (6x6, 2 boxes) and gem's
  SokobanEnv at arl's box count (6x6, 1 box); arl/Sokoban-8x8-v0 (2 boxes) vs gem
  `game:Sokoban-v0-hard` (8x8, 4 boxes) and gem at 8x8 with 2 boxes. Both sides through their
  text interfaces (arl's TextEnv with `<answer>Up</answer>`, gem with `\\boxed{up}`).
- arl/FrozenLake-v0 (a random 4x4 map per seed) vs gymnasium's FrozenLake-v1 with a random map
  per reset (generate_random_map + a new env + reset, as gymnasium can only change the map by
  constructing the env), both raw.
ratio = arl rate / peer rate, per repeat, median over repeats.

grpo: one GRPO training step, same tiny model, 2 prompts x 8 generations x 16 new tokens at
temperature 1, 134-token prompts (arl's compact one-turn prompt of a 10x10 Sokoban level), CPU,
lr 1e-6, no KL, one optimizer step per batch. arl: `Trainer.step()` (vLLM generation, GRPO
advantages, the update, the weight push into vLLM) on a one-turn Sokoban rollout; TRL: `GRPOTrainer` (transformers
generate, a constant-time reward function) timed from on_step_begin to on_step_end. One warm-up
step each, then `--repeats` steps alternating arl, TRL, arl, TRL...; ratio = arl / TRL per pair.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_PEER_PYTHON = os.environ.get("ARL_BENCH_PYTHON", "/work/bench-venv/bin/python")
GEM_SOKOBAN = {  # label -> (gem env id or None, constructor kwargs)
    "gem 6x6 (Sokoban-v0-easy, 2 boxes)": ("game:Sokoban-v0-easy", {}),
    "gem 6x6, 1 box": (None, {"dim_room": (6, 6), "num_boxes": 1, "max_turns": 10}),
    "gem 8x8 (Sokoban-v0-hard, 4 boxes)": ("game:Sokoban-v0-hard", {}),
    "gem 8x8, 2 boxes": (None, {"dim_room": (8, 8), "num_boxes": 2, "max_turns": 20}),
}
GRPO_ENV = "arl/Sokoban-10x10-v0"
GRPO = {"prompts": 2, "generations": 8, "max_tokens": 16, "lr": 1e-6}


# ================================================================================================
# workers (run in the peer venv: no arl imports)
# ================================================================================================


CLOCK = time.thread_time  # CPU time of this thread: other tenants of a shared machine do not count


def _time_resets(reset: Any, n: int, seed: int) -> float:
    t0 = CLOCK()
    for i in range(n):
        reset(seed + i)
    return (CLOCK() - t0) / n * 1e6


def _time_steps(reset: Any, step: Any, actions: list[Any], n: int, seed: int) -> float:
    """Mean CPU us per step over n random steps; the clock runs per episode (two reads per
    episode, not per step) and the resets between episodes are outside it."""
    import random

    rng = random.Random(seed)
    picks = [actions[rng.randrange(len(actions))] for _ in range(n)]
    total, done_count, i = 0.0, 0, 0
    reset(seed)
    while i < n:
        t0 = CLOCK()
        while i < n:
            done = step(picks[i])
            i += 1
            if done:
                break
        total += CLOCK() - t0
        if i < n:
            done_count += 1
            reset(seed + done_count)  # untimed
    return total / n * 1e6


class _Budget(Exception):
    pass


def _time_resets_capped(reset: Any, n: int, seed: int, budget_s: float) -> tuple[float, int]:
    """Like _time_resets, but a reset running past budget_s (wall) is stopped and counted as
    budget_s of CPU: the mean is then a lower bound. Returns (us, number of capped resets)."""
    import signal

    def alarm(*_: Any) -> None:
        raise _Budget

    old = signal.signal(signal.SIGALRM, alarm)
    total, capped = 0.0, 0
    try:
        for i in range(n):
            t0 = CLOCK()
            signal.setitimer(signal.ITIMER_REAL, budget_s)
            try:
                reset(seed + i)
                total += CLOCK() - t0
            except _Budget:
                total += budget_s
                capped += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old)
    return total / n * 1e6, capped


def worker_gem() -> None:
    import copy

    import gem
    from gem.envs.game_env.sokoban import SokobanEnv

    envs: dict[str, Any] = {}
    print("@@" + json.dumps({"ready": True, "gem": getattr(gem, "__version__", "?")}), flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            return
        cmd = json.loads(line)
        label = cmd["env"]
        if label not in envs:  # construction generates a level too (unseeded): bounded like a reset
            env_id, kwargs = GEM_SOKOBAN[label]

            def build(_seed: int, env_id: Any = env_id, kwargs: Any = kwargs, label: str = label) -> None:
                envs[label] = gem.make(env_id) if env_id else SokobanEnv(**kwargs)

            while label not in envs:
                _time_resets_capped(build, 1, 0, cmd.get("budget_s", 20.0))
        env = envs[label]

        def reset(seed: int, env: Any = env) -> None:
            env.reset(seed=seed)

        if cmd["op"] == "step":
            # Steps restore a snapshot of one generated level between episodes instead of generating
            # new ones (gem's 8x8 levels take seconds each); resets are outside the clock anyway.
            seed = cmd["seed"]
            while _time_resets_capped(reset, 1, seed, cmd.get("budget_s", 20.0))[1]:
                seed += 1
            snapshot = copy.deepcopy(env)
            live = {"env": env}

            def restore(_seed: int, live: dict = live, snapshot: Any = snapshot) -> None:
                live["env"] = copy.deepcopy(snapshot)

            def step(action: str, live: dict = live) -> bool:
                _, _, terminated, truncated, _ = live["env"].step(action)
                return terminated or truncated

            us = _time_steps(restore, step, ["\\boxed{up}", "\\boxed{down}", "\\boxed{left}",
                                             "\\boxed{right}"], cmd["n"], cmd["seed"])
            print("@@" + json.dumps({"us": us}), flush=True)
            continue

        if cmd["op"] == "reset":
            us, capped = _time_resets_capped(reset, cmd["n"], cmd["seed"], cmd.get("budget_s", 20.0))
            print("@@" + json.dumps({"us": us, "capped": capped}), flush=True)


def worker_trl(model_path: str, prompts_json: str, seed: int) -> None:
    """GRPOTrainer on the given prompts; every step waits for a line on stdin, reports its time."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    prompts = json.loads(prompts_json)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    rows = [{"prompt": p} for _ in range(64) for p in prompts]
    data = datasets.Dataset.from_list(rows)

    def reward(completions: list, **_: Any) -> list[float]:
        return [float(len(str(c)) % 3) for c in completions]  # constant-time, non-constant values

    n = GRPO["prompts"] * GRPO["generations"]
    out_dir = f"/tmp/arl-bench-trl-{os.getpid()}"
    config = trl.GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=n, gradient_accumulation_steps=1,
        num_generations=GRPO["generations"], max_completion_length=GRPO["max_tokens"], temperature=1.0,
        learning_rate=GRPO["lr"], beta=0.0, max_steps=10_000, logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, bf16=False, fp16=False, seed=seed, disable_tqdm=True,
        dataloader_num_workers=0,
    )
    stats: dict[str, Any] = {}

    class Gate(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            line = sys.stdin.readline()
            if not line or line.strip() == "stop":
                control.should_training_stop = True
                raise SystemExit(0)
            stats["t0"], stats["c0"] = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            print("@@" + json.dumps({"step_s": time.perf_counter() - stats["t0"],
                                     "cpu_s": time.process_time() - stats["c0"],
                                     "mean_length_prev": stats.get("mean_length")}), flush=True)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "completions/mean_length" in logs:
                stats["mean_length"] = logs["completions/mean_length"]

    trainer = trl.GRPOTrainer(model=model, processing_class=tok, reward_funcs=reward, args=config,
                              train_dataset=data, callbacks=[Gate()])
    print("@@" + json.dumps({"ready": True, "trl": trl.__version__, "transformers": transformers.__version__,
                             "torch_threads": torch.get_num_threads(),
                      "torch": torch.__version__}), flush=True)
    trainer.train()


class Worker:
    """A long-lived child process answering one JSON line per command line."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     env=env)
        self.info = self.read()

    def read(self) -> dict[str, Any]:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {self.proc.args} exited with {self.proc.wait()}")
            line = line.strip()
            if line.startswith("@@"):  # the workers' answers; anything else is a library's chatter
                return json.loads(line[2:])

    def ask(self, cmd: Any) -> dict[str, Any]:
        self.proc.stdin.write((cmd if isinstance(cmd, str) else json.dumps(cmd)) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ================================================================================================
# envs (arl side in this process)
# ================================================================================================


def _arl_sokoban(env_id: str) -> tuple[Any, Any]:
    from arl.envs import TextEnv

    env = TextEnv(env_id)
    answers = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"]

    def reset(seed: int) -> None:
        env.reset(seed=seed)

    def step(a: str) -> bool:
        _, _, terminated, truncated, _ = env.step(a)
        return terminated or truncated

    return (reset, step, answers), env


def _frozenlake_pair() -> tuple[tuple, tuple]:
    import gymnasium as gym
    import numpy as np
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    from arl.envs import register_envs

    register_envs()
    arl_env = gym.make("arl/FrozenLake-v0")
    holder = {"env": gym.make("FrozenLake-v1", is_slippery=False)}

    def arl_reset(seed: int) -> None:
        arl_env.reset(seed=seed)

    def arl_step(a: int) -> bool:
        _, _, terminated, truncated, _ = arl_env.step(a)
        return terminated or truncated

    def gym_reset(seed: int) -> None:
        desc = generate_random_map(size=4, p=0.8, seed=seed)
        env = gym.wrappers.TimeLimit(GymFrozenLake(desc=desc, is_slippery=False), max_episode_steps=100)
        env.reset(seed=seed)
        holder["env"] = env

    def gym_step(a: int) -> bool:
        _, _, terminated, truncated, _ = holder["env"].step(int(a))
        return terminated or truncated

    actions = list(np.arange(4))
    return (arl_reset, arl_step, actions), (gym_reset, gym_step, actions)


def bench_envs(args: argparse.Namespace) -> dict[str, Any]:
    n_reset = {"6x6": 20 if args.quick else 100, "8x8": 1 if args.quick else 3, "fl": 50 if args.quick else 500}
    n_step = 200 if args.quick else 3000
    repeats = 1 if args.quick else args.repeats
    pairs: list[tuple[str, str, str]] = [  # (arl side, peer label, size key)
        ("arl/Sokoban-v0", "gem 6x6 (Sokoban-v0-easy, 2 boxes)", "6x6"),
        ("arl/Sokoban-v0", "gem 6x6, 1 box", "6x6"),
        ("arl/Sokoban-8x8-v0", "gem 8x8 (Sokoban-v0-hard, 4 boxes)", "8x8"),
        ("arl/Sokoban-8x8-v0", "gem 8x8, 2 boxes", "8x8"),
    ]
    gem = None
    if Path(args.peer_python).exists():
        gem = Worker([args.peer_python, __file__, "--worker", "gem"])
    else:
        print(f"peer venv {args.peer_python} not found: gem-llm rows skipped")
    rows = []
    arl_sides = {env_id: _arl_sokoban(env_id)[0] for env_id in ("arl/Sokoban-v0", "arl/Sokoban-8x8-v0")}
    try:
        for arl_id, label, size in pairs:
            if gem is None:
                break
            reset, step, actions = arl_sides[arl_id]
            res: dict[str, list[float]] = {"arl_reset": [], "peer_reset": [], "arl_step": [], "peer_step": []}
            capped = 0
            for r in range(repeats):
                seed = 10_000 * (r + 1)
                res["arl_reset"].append(_time_resets(reset, n_reset[size], seed))
                ans = gem.ask({"op": "reset", "env": label, "n": n_reset[size], "seed": seed, "budget_s": args.budget_s})
                res["peer_reset"].append(ans["us"])
                capped += ans["capped"]
                res["arl_step"].append(_time_steps(reset, step, actions, n_step, seed))
                res["peer_step"].append(gem.ask({"op": "step", "env": label, "n": n_step, "seed": seed,
                                                 "budget_s": args.budget_s})["us"])
            rows.append(_env_row(f"{arl_id} (TextEnv)", label, res))
            rows[-1]["peer_resets_capped"] = capped  # gem resets stopped at --budget-s: its time is a lower bound
            print(_env_line(rows[-1]), flush=True)
    finally:
        if gem is not None:
            gem.close()
    (ar, as_, aa), (gr, gs, ga) = _frozenlake_pair()
    res = {"arl_reset": [], "peer_reset": [], "arl_step": [], "peer_step": []}
    for r in range(repeats):
        seed = 10_000 * (r + 1)
        res["arl_reset"].append(_time_resets(ar, n_reset["fl"], seed))
        res["peer_reset"].append(_time_resets(gr, n_reset["fl"], seed))
        res["arl_step"].append(_time_steps(ar, as_, aa, n_step, seed))
        res["peer_step"].append(_time_steps(gr, gs, ga, n_step, seed))
    rows.append(_env_row("arl/FrozenLake-v0 (raw)", "gymnasium FrozenLake-v1, random map per reset (raw)", res))
    print(_env_line(rows[-1]), flush=True)
    return {"rows": rows, "peer": gem.info if gem else None, "n_reset": n_reset, "n_step": n_step}


def _env_row(arl: str, peer: str, res: dict[str, list[float]]) -> dict[str, Any]:
    from _util import summary

    row: dict[str, Any] = {"arl": arl, "peer": peer}
    for k, v in res.items():
        row[k + "_us"] = summary(v)
    for op in ("reset", "step"):  # rate ratio arl/peer = peer time / arl time, per repeat
        row[f"{op}_ratio"] = summary([p / a for a, p in zip(res[f"arl_{op}"], res[f"peer_{op}"], strict=True)])
    return row


def _env_line(row: dict[str, Any]) -> str:
    return (f"  {row['arl']} vs {row['peer']}: reset {row['reset_ratio']['median']:.1f}x, "
            f"step {row['step_ratio']['median']:.1f}x")


# ================================================================================================
# grpo
# ================================================================================================


def _grpo_prompts() -> list[list[dict[str, str]]]:
    """arl's compact one-turn prompts of Sokoban 10x10 (134 tokens with the tiny tokenizer) for two
    seeds: what TRL trains on; arl's Trainer renders the same kind of prompt for its own seeds."""
    from arl.envs import TextEnv
    from arl.envs.prompts import compact_messages

    out = []
    for seed in (0, 1):
        env = TextEnv(GRPO_ENV)
        obs, _ = env.reset(seed=seed)
        out.append(compact_messages(obs, 1))
    return out


ARL_WORKER = r"""
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[1])
from _util import quiet_logs
quiet_logs()
from arl.config import load_config
from arl.train import Trainer

async def main():
    config = load_config(sys.argv[2], json.loads(sys.argv[3]))
    async with Trainer(config) as trainer:
        await trainer.setup()
        import torch
        print("@@" + json.dumps({"ready": True, "torch_threads": torch.get_num_threads()}), flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line or line.strip() == "stop":
                return
            t0, c0 = time.perf_counter(), time.process_time()
            m = await trainer.step()
            print("@@" + json.dumps({"step_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                              "mean_length":
                              m["train/num_response_tokens"] / max(1.0, m["train/num_samples"]),
                              "samples": m["train/num_samples"],
                              **{k: v for k, v in m.items() if k.startswith("timing/")}}), flush=True)

asyncio.run(main())
"""


def bench_grpo(args: argparse.Namespace) -> dict[str, Any] | None:
    import tempfile

    from arl.models import resolve_model

    if not Path(args.peer_python).exists():
        print(f"peer venv {args.peer_python} not found: TRL comparison skipped")
        return None
    model_path = resolve_model("tiny")
    from transformers import AutoTokenizer

    from arl.rollout.base import chat_ids

    prompts = _grpo_prompts()
    tok = AutoTokenizer.from_pretrained(model_path)
    prompt_lens = [len(chat_ids(tok, p)) for p in prompts]
    out_dir = tempfile.mkdtemp(prefix="arl-bench-grpo-")
    overrides = [
        "name=bench_grpo", f"out_dir={out_dir}", "steps=100000", "sft.steps=0", "eval.at_start=false",
        "eval.every=0", "tensorboard=false", f"rollout.env_id={GRPO_ENV}", "rollout.mode=step",
        "rollout.manager.prompt_style=compact",
        f"rollout.num_groups={GRPO['prompts']}", f"rollout.group_size={GRPO['generations']}",
        f"rollout.manager.max_tokens={GRPO['max_tokens']}", "rollout.manager.max_turns=1",
        "rollout.manager.history_len=0", "rollout.manager.temperature=1.0", "algo.estimator=grpo",
        f"optim.lr={GRPO['lr']}", f"optim.micro_batch_size={GRPO['prompts'] * GRPO['generations']}",
        "algo.kl_coef=0.0", f"engine.backend={args.arl_backend}", "engine.kv_cache_memory_bytes=134217728",
        "engine.max_model_len=1024",
    ]
    config_path = str(HERE.parent / "configs" / "tiny_frozenlake_gigpo.yaml")
    env = None
    if args.threads:
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    arl = Worker([sys.executable, "-c", ARL_WORKER, str(HERE), config_path, json.dumps(overrides)], env=env)
    trl_worker = None
    try:
        trl_worker = Worker([args.peer_python, __file__, "--worker", "trl", "--model", model_path,
                             "--prompts", json.dumps(prompts)], env=env)
        runs: dict[str, list[Any]] = {"arl": [], "trl": []}
        arl.ask("step")  # warm-ups
        trl_worker.ask("step")
        repeats = 2 if args.quick else args.repeats
        for r in range(repeats):
            a = arl.ask("step")
            b = trl_worker.ask("step")
            runs["arl"].append(a)
            runs["trl"].append(b)
            print(f"  pair {r}: arl {a['step_s']:.3f} s (CPU {a['cpu_s']:.2f} s, {a['mean_length']:.1f} tokens/sample), "
                  f"TRL {b['step_s']:.3f} s (CPU {b['cpu_s']:.2f} s, {b.get('mean_length_prev')} tokens/sample), "
                  f"ratio {a['step_s'] / b['step_s']:.2f}", flush=True)
    finally:
        arl.close()
        if trl_worker is not None:
            trl_worker.close()
    from _util import summary

    arl_s = [x["step_s"] for x in runs["arl"]]
    trl_s = [x["step_s"] for x in runs["trl"]]
    phases = {k: summary([x[k] for x in runs["arl"]]) for k in runs["arl"][0] if k.startswith("timing/")}
    return {"arl_step_s": summary(arl_s), "trl_step_s": summary(trl_s),
            "ratio": summary([a / b for a, b in zip(arl_s, trl_s, strict=True)]), "arl_phases": phases,
            "arl_mean_tokens": statistics.median(x["mean_length"] for x in runs["arl"]),
            "trl_mean_tokens": [x.get("mean_length_prev") for x in runs["trl"]],
            "prompt_tokens": prompt_lens, "trl": trl_worker.info if trl_worker else None, "arl": arl.info,
            "arl_cpu_s": summary([x["cpu_s"] for x in runs["arl"]]),
            "cpu_ratio": summary([a["cpu_s"] / b["cpu_s"] for a, b in zip(runs["arl"], runs["trl"], strict=True)]),
            "trl_cpu_s": summary([x["cpu_s"] for x in runs["trl"]]), "threads": args.threads,
            "geometry": GRPO, "arl_backend": args.arl_backend, "overrides": overrides}


# ================================================================================================


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", default="all", choices=["envs", "grpo", "all"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON)
    parser.add_argument("--budget-s", type=float, default=20.0,
                        help="a gem reset running longer is stopped and counted as this long (lower bound)")
    parser.add_argument("--threads", type=int, default=0,
                        help="OMP_NUM_THREADS for both GRPO workers (0: the libraries' defaults)")
    parser.add_argument("--arl-backend", default="vllm", choices=["vllm", "vllm-async", "hf"])
    parser.add_argument("--quick", action="store_true", help="smoke size (peers skipped without their venv)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", choices=["gem", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "gem":
        return worker_gem()
    if args.worker == "trl":
        return worker_trl(args.model, args.prompts, seed=0)

    sys.path.insert(0, str(HERE))
    from _util import cell, result_path, table, write_result

    started = time.perf_counter()
    payload: dict[str, Any] = {}
    if args.what in ("envs", "all"):
        env_res = bench_envs(args)
        payload["envs"] = env_res
        print(f"\nreset / step: mean us per call, median of {1 if args.quick else args.repeats} (min–max); "
              "ratio = arl rate / peer rate")
        print(table(["arl", "peer", "arl reset us", "peer reset us", "reset ratio", "arl step us", "peer step us",
                     "step ratio"],
                    [[r["arl"], r["peer"], cell(r["arl_reset_us"], "{:.1f}"),
                      cell(r["peer_reset_us"], "{:.1f}") + (f" (>=; {r['peer_resets_capped']} capped)"
                                                             if r.get("peer_resets_capped") else ""),
                      cell(r["reset_ratio"], "{:.1f}x"), cell(r["arl_step_us"], "{:.1f}"),
                      cell(r["peer_step_us"], "{:.1f}"), cell(r["step_ratio"], "{:.1f}x")]
                     for r in env_res["rows"]]))
    if args.what in ("grpo", "all"):
        grpo = bench_grpo(args)
        payload["grpo"] = grpo
        if grpo is not None:
            g = GRPO
            print(f"\nGRPO step, tiny model, {g['prompts']} prompts x {g['generations']} generations x "
                  f"{g['max_tokens']} tokens, prompts {grpo['prompt_tokens']} tokens; "
                  f"median of {int(grpo['ratio']['n'])} interleaved pairs (min–max)")
            print(f"threads per process: arl {grpo['arl'].get('torch_threads')}, TRL {grpo['trl'].get('torch_threads')}")
            print(table(["arl step s", "TRL step s", "arl / TRL", "arl CPU s", "TRL CPU s", "arl / TRL (CPU)"],
                        [[cell(grpo["arl_step_s"], "{:.3f}"), cell(grpo["trl_step_s"], "{:.3f}"),
                          cell(grpo["ratio"], "{:.2f}"), cell(grpo["arl_cpu_s"], "{:.3f}"),
                          cell(grpo["trl_cpu_s"], "{:.3f}"), cell(grpo["cpu_ratio"], "{:.2f}")]]))
    name = "peers" if args.what == "all" else f"peers_{args.what}"
    write_result(args.out or result_path(name, args.quick), args, payload, started)


if __name__ == "__main__":
    main()
