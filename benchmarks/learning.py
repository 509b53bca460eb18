"""Learning curves: GRPO vs GiGPO (mean_norm, mean_std_norm) on FrozenLake 4x4 and Sokoban 6x6.

    .venv/bin/python benchmarks/learning.py                 # 2 games x 3 estimators x 3 seeds (~3 h on 2 cores)
    .venv/bin/python benchmarks/learning.py --quick         # smoke size: FrozenLake, grpo + gigpo-mean, 1 seed (~1 min)
    .venv/bin/python benchmarks/learning.py --games sokoban --seeds 0 1 2 3 4 --steps 60 optim.lr=3e-4
    .venv/bin/python benchmarks/learning.py --config-frozenlake configs/other.yaml   # swap a game's config
    .venv/bin/python benchmarks/learning.py --runs-dir runs/ --resume ...   # runs cut off go on from their checkpoints
    .venv/bin/python benchmarks/learning.py --games frozenlake --estimators gigpo-mean proxy-gigpo-mean \
        --out benchmarks/results/learning-proxy.json    # the step manager beside a black-box agent through the proxy

Every run is the game's config (configs/tiny_frozenlake_gigpo.yaml, configs/tiny_sokoban_gigpo.yaml)
with the estimator (`grpo`: algo.estimator=grpo; `gigpo-mean` / `gigpo-meanstd`: algo.estimator=gigpo
with algo.gigpo_norm=mean_norm / mean_std_norm; `proxy-gigpo-mean`: GiGPO mean_norm with
rollout.mode=proxy, arl's GymRunner playing through the in-process proxy with the step tracker and
the step manager's prompts), the seed, and the trailing dotted overrides, which apply to every run.
Per run it also records GiGPO's anchor-group statistics per training step, printed per run so two
rollouts of the same setup can be compared, and a per-seed start -> final table. Each run keeps the config's format warm-start (so every curve starts at the
warm-start level) and evaluates at the start and every `eval.every` steps on the config's fixed
validation panel (the same `eval.num_seeds` levels for every run). All runs of a game share one
engine, started once (vLLM start-up is ~20-40 s on CPU); each run pushes its own weights into it.

Env steps = the cumulative number of agent turns played in *training* rollouts (rollout/num_turns,
plus rollout/branch_turns for a forked run: `fork-gigpo-mean` forks each episode's first state);
evaluation episodes and the warm-start's scripted episodes (the same for every estimator) are not
counted. At every evaluation the script records (env steps, validation success). Per game and
estimator: mean ± std over seeds (std with n-1) at each evaluation index (all seeds share the
schedule; the x of the mean curve is the seeds' mean env steps), the final success, and the env
steps at which the mean curve first reaches GRPO's final mean success, linearly interpolated between
evaluation points; the same rule gives GRPO's own figure, and "ratio vs GRPO" divides by it. The goal
is a ratio <= 0.7 for GiGPO. Writes results/learning.json (every run's curve) and results/learning.png
(one panel per game: mean ± std band per estimator); --quick writes the git-ignored
results/learning-quick.tmp and results/learning-quick.png (git-ignored too).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _util import quiet_logs, result_path, table, write_result  # noqa: E402

quiet_logs()

REPO = Path(__file__).resolve().parent.parent
GAMES = {"frozenlake": REPO / "configs" / "tiny_frozenlake_gigpo.yaml",
         "sokoban": REPO / "configs" / "tiny_sokoban_gigpo.yaml"}
GAME_NAMES = {"frozenlake": "FrozenLake 4x4", "sokoban": "Sokoban 6x6"}
ESTIMATORS = {
    "grpo": ["algo.estimator=grpo"],
    "gigpo-mean": ["algo.estimator=gigpo", "algo.gigpo_norm=mean_norm"],
    "gigpo-meanstd": ["algo.estimator=gigpo", "algo.gigpo_norm=mean_std_norm"],
    # GiGPO mean_norm with the rollout played by agent code: arl's GymRunner through the in-process
    # proxy (step tracker, the step manager's prompts), anchors keyed by the grids it reports.
    "proxy-gigpo-mean": ["algo.estimator=gigpo", "algo.gigpo_norm=mean_norm", "rollout.mode=proxy",
                         "rollout.proxy.runner=gym", "rollout.proxy.transport=inprocess",
                         "rollout.proxy.granularity=step", "rollout.proxy.runner_kwargs={conversation: step}"],
    # GiGPO mean_norm whose first state is forked: an anchor group of exactly 4 there (arl/rollout/fork.py)
    "fork-gigpo-mean": ["algo.estimator=gigpo", "algo.gigpo_norm=mean_norm",
                        "rollout.manager.fork={k: 4, at: first, states: 1}"],
}
COLORS = {"grpo": "tab:orange", "gigpo-mean": "tab:blue", "gigpo-meanstd": "tab:green",
          "proxy-gigpo-mean": "tab:purple", "fork-gigpo-mean": "tab:red"}  # the same in every panel
ANCHOR_STATS = ("train/gigpo_anchor_group_size_mean", "train/gigpo_anchor_singleton_frac")
RUN_OVERRIDES = ["tensorboard=false", "keep_checkpoints=1", "eval.at_start=true"]
QUICK_OVERRIDES = ["rollout.num_groups=2", "rollout.group_size=2", "eval.num_seeds=4", "eval.every=1", "sft.steps=1",
                   "engine.kv_cache_memory_bytes=134217728"]
GOAL_RATIO = 0.7
TOL = 1e-9  # success rates are averages of 0/1 outcomes: compare with a tolerance

# docs/reference.md §6. "budget" is the training budget where the reference gives it.
ANCHORS = [
    {"source": "ROLL tech report", "model": "Qwen2.5-0.5B-Instruct", "size": "0.5B",
     "task": "SimpleSokoban 6x6 val success", "result": "13.3% -> 35.2% (valid actions 43.6% -> 73.4%)",
     "extra": "same game (6x6, 1 box, 10 actions)"},
    {"source": "ROLL tech report", "model": "Qwen2.5-0.5B-Instruct", "size": "0.5B",
     "task": "FrozenLake val success", "result": "12.9% -> 23.8%",
     "extra": "same game (4x4, non-slippery, p = 0.8)"},
    {"source": "RAGEN v1 (StarPO-S)", "model": "Qwen2.5-0.5B-Instruct", "size": "0.5B",
     "task": "Sokoban / FrozenLake (slippery)", "result": "~7% -> 20.3% / ~3.5% -> 21.8%",
     "budget": "~200 steps x 128 trajectories",
     "extra": "StarPO-S (PPO-style), not GRPO/GiGPO; FrozenLake slippery (ours non-slippery)"},
    {"source": "RAGEN-2", "model": "Qwen2.5-3B (base), GRPO", "size": "3B",
     "task": "Sokoban / FrozenLake (non-slippery)", "result": "12.1% / 70.9%",
     "extra": "after-RL only; base (not instruct) model; FrozenLake p = 0.9 (ours 0.8)"},
    {"source": "GiGPO paper", "model": "Qwen2.5-1.5B-Instruct", "size": "1.5B",
     "task": "ALFWorld / WebShop success", "result": "GRPO 72.8 / 56.8 -> GiGPO 86.7 / 67.4",
     "extra": "other tasks; compares final success at equal budget, not env steps to a level"},
    {"source": "GiGPO paper", "model": "Qwen2.5-VL-3B", "size": "3B",
     "task": "Sokoban 6x6 visual", "result": "GRPO 67.1 -> GiGPO 81.0",
     "extra": "image observations (VLM) vs our text grid; 15-action limit (verl-agent) vs 10; final success, "
              "not env steps"},
]


# -- running -------------------------------------------------------------------------------------------
def run_overrides(args: argparse.Namespace, game: str, estimator: str | None, seed: int | None,
                  runs_dir: Path) -> list[str]:
    """Overrides of one run, last wins: harness defaults, quick size, the user's, then the run's own."""
    out = [*RUN_OVERRIDES, *(QUICK_OVERRIDES if args.quick else []), *args.overrides]
    if args.steps is not None:
        out.append(f"steps={args.steps}")
    if estimator is not None:
        out += [*ESTIMATORS[estimator], f"seed={seed}", f"out_dir={runs_dir / game}", f"name={estimator}-s{seed}"]
    return out


def curve_of(history: list[dict[str, Any]]) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """(evaluation points, training steps) of one run's history, with cumulative training env steps
    and, per training step, GiGPO's anchor-group statistics where the run has them."""
    evals, train, env_steps = [], [], 0.0
    for row in history:
        if row["step"] > 0 and "rollout/num_turns" in row:
            # a forked run's branches are env steps too (rollout/branch_turns; absent without forks)
            env_steps += row["rollout/num_turns"] + row.get("rollout/branch_turns", 0.0)
            train.append({"step": row["step"], "env_steps": env_steps,
                          "success": row.get("rollout/success_rate", float("nan")),
                          **{k.removeprefix("train/gigpo_"): row[k] for k in ANCHOR_STATS if k in row}})
        if "eval/success_rate" in row:
            evals.append({"step": row["step"], "env_steps": env_steps, "success": row["eval/success_rate"],
                          "valid_action_rate": row.get("eval/valid_action_rate", float("nan"))})
    return evals, train


async def run_game(game: str, config_path: Path, args: argparse.Namespace, runs_dir: Path) -> dict[str, Any]:
    """Every (estimator, seed) run of one game on one shared engine."""
    import torch

    from arl.engine import make_engine
    from arl.train import Trainer
    from arl.train.lora import engine_config

    base = resolved_config(config_path, run_overrides(args, game, None, None, runs_dir))
    t0 = time.perf_counter()
    engine = make_engine(engine_config(base))  # with vLLM's LoRA path when the config trains LoRA
    startup_s = time.perf_counter() - t0
    print(f"[{game}] engine {base.engine.backend} started in {startup_s:.1f} s", flush=True)
    runs, n_params = [], None
    try:
        for estimator in args.estimators:
            for seed in args.seeds:
                config = resolved_config(config_path, run_overrides(args, game, estimator, seed, runs_dir))
                assert config.engine == base.engine, "every run of a game must fit the shared engine"
                tag = f"[{game} {estimator} s{seed}]"
                t0 = time.perf_counter()

                def progress(step: int, m: dict[str, float], tag: str = tag, total: int = config.steps,
                             t0: float = t0) -> None:
                    if "eval/success_rate" in m:
                        print(f"  {tag} step {step}/{total}: val success {m['eval/success_rate']:.3f}, "
                              f"{time.perf_counter() - t0:.0f} s", flush=True)

                # --resume: a run with a checkpoint in --runs-dir goes on from it (a finished one only
                # reads its history back), so a run cut off by the end of a session is not lost
                resume = args.resume and any((runs_dir / game / f"{estimator}-s{seed}").glob("ckpt_*"))
                trainer = Trainer(config, engine=engine, resume=resume)
                try:
                    history = await trainer.train(progress=progress)
                    n_params = n_params or sum(p.numel() for p in trainer.model.parameters())
                finally:
                    await trainer.close()  # the logger; the injected engine stays open
                piece = time.perf_counter() - t0
                # A resumed run's clock saw only its last piece: its wall time is absent (None), not that piece.
                wall = None if resume else piece
                evals, train = curve_of(history)
                print(f"  {tag} done in {piece:.0f} s{' (resumed: this piece only)' if resume else ''}: val success "
                      f"{evals[0]['success']:.3f} -> {evals[-1]['success']:.3f} after {evals[-1]['env_steps']:.0f} "
                      "env steps", flush=True)
                runs.append({"estimator": estimator, "seed": seed, "wall_s": wall, "steps": config.steps,
                             "episodes_per_step": config.rollout.num_groups * config.rollout.group_size,
                             "curve": evals, "train": train})
                del trainer
                gc.collect()
    finally:
        await engine.close()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return {"game": game, "config": str(config_path), "overrides": list(args.overrides), "setup": setup_of(base),
            "engine_startup_s": startup_s, "model": base.model,
            "model_params": n_params, "device": device, "steps": base.steps,
            "episodes_per_step": base.rollout.num_groups * base.rollout.group_size,
            "eval_every": base.eval.every, "eval_num_seeds": base.eval.num_seeds, "runs": runs}


def resolved_config(config_path: Path, overrides: list[str]) -> Any:
    """The config as the Trainer resolves it (optim.precision "auto", engine.dtype "policy"): the shared
    engine is the one each run's trainer would have built, and the setup a result file records is the
    one an --add-to run is compared with."""
    from arl.config import load_config
    from arl.train.precision import resolve_precision

    return resolve_precision(load_config(config_path, overrides))


def setup_of(config: Any) -> dict[str, Any]:
    """The resolved config every run of a game shares (the per-run name, seed and folder left out)."""
    from arl.config import unstructure

    setup = json.loads(json.dumps(unstructure(config)))  # the form it has once read back from a result file
    for key in ("name", "seed", "out_dir"):
        setup.pop(key, None)
    return setup


def load_previous(path: Path) -> list[dict[str, Any]]:
    """The games of an earlier result JSON, for `--add-to`."""
    games = json.loads(path.read_text())["games"]
    if any("setup" not in g for g in games):
        raise SystemExit(f"--add-to: {path} predates the recorded setup; its runs cannot be checked, so not pooled")
    return games


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{path}.{k}".lstrip("."))]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


# Config keys added after results were recorded, with the value that does what the code did before
# they existed: a result without the key pools with runs that have exactly this value.
ADDED_KEYS = {
    "overwrite": False,  # run-directory handling only
    "rollout.max_staleness": 0,  # synchronous training, the only mode before
    "sft.teacher": "auto",  # answers for text agents: the only teacher before
    "rollout.spare_groups": 0,  # no over-provisioning
    "optim.gradient_checkpointing": False,  # activations kept, as before
    "optim.precision": "fp32",  # the only precision before
    # what the run dir records for `arl view` (arl/train/episodes.py): no effect on training
    "eval.record_episodes": 4, "eval.state_samples": 8,
    "lora": {"rank": 0, "alpha": 16.0, "dropout": 0.0,  # every weight trained: LoRA's section off
             "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]},
}


def check_same_setup(previous_game: dict[str, Any], setup: dict[str, Any]) -> None:
    """SystemExit naming every differing field unless `setup` is the earlier game's (estimator aside;
    keys added since, at their old behaviour's value, aside: `ADDED_KEYS`)."""
    ignore = ("algo.estimator", "algo.gigpo_norm", "algo.gigpo_mode", "rollout.mode", "rollout.proxy",  # set per run by ESTIMATORS
              "rollout.manager.fork")
    added = {f"{k}: None vs {v!r}" for k, v in ADDED_KEYS.items()}
    differ = [d for d in _differences(previous_game["setup"], setup)
              if not d.split(":")[0].startswith(ignore) and d not in added]
    if differ:
        raise SystemExit(f"--add-to: {previous_game['game']} was run with another setup ({'; '.join(differ)}); "
                         "use a new --out")


def merge_games(previous: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pool the runs of an earlier result with this invocation's (`--add-to`): more seeds or estimators.

    A game's runs are pooled only when both ran the same resolved config apart from the estimator
    (`setup`, compared field by field); a new (estimator, seed) run replaces an earlier one. Games
    only in `previous` are kept.
    """
    merged = {g["game"]: dict(g) for g in previous}
    for g in new:
        old = merged.get(g["game"])
        if old is None:
            merged[g["game"]] = g
            continue
        check_same_setup(old, g["setup"])
        fresh = {(r["estimator"], r["seed"]) for r in g["runs"]}
        old["runs"] = [r for r in old["runs"] if (r["estimator"], r["seed"]) not in fresh] + g["runs"]
        old["engine_startup_s"] = g["engine_startup_s"]
    return list(merged.values())


# -- analysis ------------------------------------------------------------------------------------------
def _std(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def env_steps_to_reach(xs: list[float], ys: list[float], target: float) -> float | None:
    """First x where the piecewise-linear curve (xs, ys) reaches `target`; None if it never does."""
    for i, y in enumerate(ys):
        if y >= target - TOL:
            if i == 0:
                return xs[0]
            x0, y0 = xs[i - 1], ys[i - 1]
            return x0 + (target - y0) / (y - y0) * (xs[i] - x0)  # y0 < target <= y
    return None


def aggregate(game_result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per estimator: the mean ± std curve over seeds and the env steps to GRPO's final success."""
    rows = []
    for estimator in dict.fromkeys(r["estimator"] for r in game_result["runs"]):
        runs = [r for r in game_result["runs"] if r["estimator"] == estimator]
        schedule = [p["step"] for p in runs[0]["curve"]]
        assert all([p["step"] for p in r["curve"]] == schedule for r in runs), "seeds must share the eval schedule"
        mean = [{"step": s,
                 "env_steps": statistics.fmean(r["curve"][i]["env_steps"] for r in runs),
                 "success": statistics.fmean(r["curve"][i]["success"] for r in runs),
                 "success_std": _std([r["curve"][i]["success"] for r in runs])} for i, s in enumerate(schedule)]
        rows.append({"estimator": estimator, "seeds": [r["seed"] for r in runs], "curve": mean,
                     "start": mean[0]["success"], "start_std": mean[0]["success_std"],
                     "final": mean[-1]["success"], "final_std": mean[-1]["success_std"],
                     "env_steps_total": mean[-1]["env_steps"],
                     "wall_s_per_run": (statistics.fmean(walls) if (walls := [r["wall_s"] for r in runs
                                                                              if r["wall_s"] is not None]) else None)})
    grpo = next((r for r in rows if r["estimator"] == "grpo"), None)
    target = grpo["final"] if grpo else None
    grpo_reach = None
    if grpo is not None:
        grpo_reach = env_steps_to_reach([p["env_steps"] for p in grpo["curve"]],
                                        [p["success"] for p in grpo["curve"]], target)
    for r in rows:
        r["target"] = target
        r["env_steps_to_target"] = None if target is None else env_steps_to_reach(
            [p["env_steps"] for p in r["curve"]], [p["success"] for p in r["curve"]], target)
        r["ratio_vs_grpo"] = (r["env_steps_to_target"] / grpo_reach
                              if r["env_steps_to_target"] is not None and grpo_reach else None)
    return rows


def goal_status(games: dict[str, list[dict[str, Any]]]) -> tuple[str, list[str]]:
    """'met' when every GiGPO mode reaches GRPO's final success in <= 0.7x its env steps on every game."""
    verdicts, notes = [], []
    for game, rows in games.items():
        grpo = next((r for r in rows if r["estimator"] == "grpo"), None)
        for r in rows:
            if not r["estimator"].startswith("gigpo"):
                continue
            if grpo is None:
                notes.append(f"{game} {r['estimator']}: no GRPO run")
                verdicts.append(None)
            elif not grpo["env_steps_to_target"]:
                notes.append(f"{game} {r['estimator']}: undefined (GRPO's final success "
                             f"{grpo['final']:.1%} was already reached at the start)")
                verdicts.append(None)
            elif r["ratio_vs_grpo"] is None:
                notes.append(f"{game} {r['estimator']}: never reached GRPO's final {grpo['final']:.1%}")
                verdicts.append(False)
            else:
                notes.append(f"{game} {r['estimator']}: {r['ratio_vs_grpo']:.2f}x")
                verdicts.append(r["ratio_vs_grpo"] <= GOAL_RATIO + TOL)
    if not verdicts or all(v is None for v in verdicts):
        return "not measured", notes
    if all(v is True for v in verdicts):
        return "met", notes
    return ("partly met" if any(v is True for v in verdicts) else "not met"), notes


# -- output --------------------------------------------------------------------------------------------
def pct(mean: float, std: float | None = None) -> str:
    return f"{mean:.1%}" if std is None else f"{mean * 100:.1f} ± {std * 100:.1f}%"


def game_tables(game_result: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    g = game_result
    n_seeds = len(rows[0]["seeds"]) if rows else 0
    head = (f"### {GAME_NAMES.get(g['game'], g['game'])} ({Path(g['config']).name}): {n_seeds} seed{'s' * (n_seeds != 1)}, "
            f"{g['steps']} steps x {g['episodes_per_step']} episodes, validation on {g['eval_num_seeds']} fixed "
            f"levels every {g['eval_every']} steps; engine start-up {g['engine_startup_s']:.0f} s (shared)")
    summary = table(
        ["estimator", "start success", "final success", "env steps (total)", "env steps to GRPO-final",
         "ratio vs GRPO", "wall s/run"],
        [[r["estimator"], pct(r["start"], r["start_std"]), pct(r["final"], r["final_std"]),
          f"{r['env_steps_total']:.0f}",
          "-" if r["target"] is None else ("not reached" if r["env_steps_to_target"] is None
                                           else f"{r['env_steps_to_target']:.0f}"),
          "-" if r["ratio_vs_grpo"] is None else f"{r['ratio_vs_grpo']:.2f}x",
          "-" if r["wall_s_per_run"] is None else f"{r['wall_s_per_run']:.0f}"] for r in rows])
    target = rows[0]["target"] if rows else None
    note = "" if target is None else f"GRPO's final mean success (the target): {target:.1%}\n"
    steps = [p["step"] for p in rows[0]["curve"]] if rows else []
    curve = table(["step", *[f"{r['estimator']}: success (env steps)" for r in rows]],
                  [[s, *[f"{pct(r['curve'][i]['success'], r['curve'][i]['success_std'])} "
                         f"({r['curve'][i]['env_steps']:.0f})" for r in rows]] for i, s in enumerate(steps)])
    out = f"{head}\n\n{summary}\n\n{note}\nValidation success (mean ± std over seeds) at each evaluation:\n\n{curve}"
    return out + per_seed_table(g) + anchor_table(g)


def per_seed_table(g: dict[str, Any]) -> str:
    """Start -> final validation success of every run, and whether it ends >= 2x and >= +25 points."""
    rows = []
    for r in sorted(g["runs"], key=lambda r: (r["estimator"], r["seed"])):
        a, b = r["curve"][0]["success"], r["curve"][-1]["success"]
        rows.append([r["estimator"], r["seed"], f"{a:.1%}", f"{b:.1%}", f"{b / a:.2f}x" if a else "-",
                     f"{100 * (b - a):+.1f}", "yes" if a and b >= 2 * a - TOL and b - a >= 0.25 - TOL else "no"])
    return "\n\nPer seed:\n\n" + table(
        ["estimator", "seed", "start", "final", "ratio", "points", ">= 2x and >= +25"], rows)


def anchor_table(g: dict[str, Any]) -> str:
    """GiGPO's anchor-group statistics per run (mean over training steps; first and last step)."""
    rows = []
    for r in sorted(g["runs"], key=lambda r: (r["seed"], r["estimator"])):
        steps = [t for t in r.get("train", []) if "anchor_group_size_mean" in t]
        if not steps:
            continue
        size = [t["anchor_group_size_mean"] for t in steps]
        single = [t["anchor_singleton_frac"] for t in steps]
        rows.append([r["seed"], r["estimator"], f"{statistics.fmean(size):.3f}", f"{size[0]:.3f} / {size[-1]:.3f}",
                     f"{statistics.fmean(single):.3f}", f"{single[0]:.3f} / {single[-1]:.3f}"])
    if not rows:
        return ""
    return "\n\nGiGPO anchor groups per run (training batches):\n\n" + table(
        ["seed", "estimator", "mean group size", "step 1 / last", "singleton fraction", "step 1 / last"], rows)


def anchors_table(results: list[dict[str, Any]]) -> str:
    if not results:
        return ""
    g = results[0]
    params = f"{g['model_params'] / 1e6:.1f}M-parameter" if g["model_params"] else "?"
    budgets = {f"{r['steps']} steps x {r['episodes_per_step']} episodes" for r in results}
    budget = " / ".join(sorted(budgets))
    # what the model and prompts are, from the recorded setup (the tiny model is the zoo's only random-init one)
    init = "random init" if str(g["model"]).startswith("tiny") else "pretrained"
    manager = g.get("setup", {}).get("rollout", {}).get("manager", {})
    style = manager.get("prompt_style", "compact")
    lines = [k for k in ("positions", "surroundings") if (manager.get("env_kwargs") or {}).get(k)]
    prompt = ("compact prompts (grid + turns left" + "".join(f" + the {k} line" for k in lines) + ", no instructions)"
              if style == "compact" else "full prompts (instructions, grid, history)")
    ours = (f"This harness: `{g['model']}` ({params}, {init}, format warm-start on random valid actions), "
            f"{prompt}, step mode; {budget} per run; {g['device']}.")
    rows = []
    for a in ANCHORS:
        diffs = [f"{a['size']} pretrained vs {params} {'from-scratch' if init == 'random init' else init} `{g['model']}`",
                 "full instructions vs compact prompt" if style == "compact" else "their prompts vs arl's full prompt",
                 f"budget {a.get('budget', 'not in REFERENCE')} vs {budget}",
                 f"their GPU vs our {g['device']}", a["extra"]]
        rows.append([a["source"], a["model"], a["task"], a["result"], "; ".join(diffs)])
    return (f"Published anchors (REFERENCE.md §6; not reproduced here). {ours}\n\n"
            + table(["source", "model", "task", "published (before -> after RL)", "differences from this harness"],
                    rows))


def plot(path: Path, results: list[dict[str, Any]], aggregates: dict[str, list[dict[str, Any]]]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6 * len(results), 4.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(results), squeeze=False)[0]
    for ax, g in zip(axes, results, strict=True):
        rows = aggregates[g["game"]]
        for r in rows:
            xs = [p["env_steps"] for p in r["curve"]]
            ys = [p["success"] * 100 for p in r["curve"]]
            sd = [p["success_std"] * 100 for p in r["curve"]]
            (line,) = ax.plot(xs, ys, marker="o", color=COLORS.get(r["estimator"]),
                              label=f"{r['estimator']} (n={len(r['seeds'])})")
            ax.fill_between(xs, [y - s for y, s in zip(ys, sd, strict=True)],
                            [y + s for y, s in zip(ys, sd, strict=True)], color=line.get_color(), alpha=0.2)
        top = max((p["success"] + p["success_std"] for r in rows for p in r["curve"]), default=0.0) * 100
        ax.set_ylim(-1, min(100, top) + 5)
        if rows and rows[0]["target"] is not None:
            ax.axhline(rows[0]["target"] * 100, color="gray", linestyle="--", linewidth=1, label="GRPO final")
        ax.set_title(f"{GAME_NAMES.get(g['game'], g['game'])}: validation success ({g['eval_num_seeds']} levels)")
        ax.set_xlabel("training env steps (agent turns)")
        ax.set_ylabel("success % (mean ± std over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", nargs="+", choices=list(GAMES), default=list(GAMES))
    parser.add_argument("--config-frozenlake", type=Path, default=GAMES["frozenlake"])
    parser.add_argument("--config-sokoban", type=Path, default=GAMES["sokoban"])
    parser.add_argument("--estimators", nargs="+", choices=list(ESTIMATORS), default=None,
                        help="default: grpo gigpo-mean gigpo-meanstd (--quick: grpo gigpo-mean); "
                             "proxy-gigpo-mean (GymRunner through the proxy) and fork-gigpo-mean (forked first "
                             "states) run only when named")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: the config's)")
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke size: FrozenLake, grpo + gigpo-mean, seed 0, 2 steps of 2x2 episodes")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/learning.json")
    parser.add_argument("--resume", action="store_true",
                        help="with --runs-dir: runs that have a checkpoint there go on from their latest one")
    parser.add_argument("--add-to", type=Path, default=None,
                        help="pool these runs with an earlier result JSON of the same setup (more seeds or "
                             "estimators) and write the pooled result (default --out: that file)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every run, e.g. optim.lr=3e-4")
    args = parser.parse_args()
    if args.quick:
        args.games, args.seeds, args.steps = ["frozenlake"], [0], 2
        args.estimators = args.estimators or ["grpo", "gigpo-mean"]
    args.estimators = args.estimators or ["grpo", "gigpo-mean", "gigpo-meanstd"]
    configs = {"frozenlake": args.config_frozenlake, "sokoban": args.config_sokoban}
    out = args.out or args.add_to or result_path("learning", args.quick)
    previous = load_previous(args.add_to) if args.add_to else []
    if previous:  # refuse a mismatched setup now, not after hours of runs
        for g in previous:
            if g["game"] in args.games:
                check_same_setup(g, setup_of(resolved_config(configs[g["game"]],
                                                             run_overrides(args, g["game"], None, None, Path(".")))))
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="arl-bench-learning-"))
    started = time.perf_counter()
    results = []
    try:
        for game in args.games:
            results.append(asyncio.run(run_game(game, configs[game], args, runs_dir)))
    finally:
        if args.runs_dir is None:
            shutil.rmtree(runs_dir, ignore_errors=True)
    results = merge_games(previous, results)
    aggregates = {g["game"]: aggregate(g) for g in results}
    print()
    for g in results:
        print(game_tables(g, aggregates[g["game"]]) + "\n")
    status, notes = goal_status(aggregates)
    print(f"Goal: GiGPO reaches GRPO's final success in <= {GOAL_RATIO}x the env steps: **{status}** "
          f"({'; '.join(notes) or 'no GiGPO run'})\n")
    print(anchors_table(results) + "\n")
    png = out.with_suffix(".png")  # learning.json -> learning.png; learning-quick.tmp -> learning-quick.png
    plot(png, results, aggregates)
    write_result(out, args, {"games": results, "aggregates": aggregates, "goal": {"status": status, "notes": notes,
                                                                                   "ratio": GOAL_RATIO},
                             "anchors": ANCHORS, "plot": str(png)}, started)


if __name__ == "__main__":
    main()
