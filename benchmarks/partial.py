"""Partial rollouts on a long-tailed workload: sync vs spare groups vs carrying unfinished episodes over.

    .venv/bin/python benchmarks/partial.py               # vLLM engine, 4 x 4 episodes, 6 measured steps per mode
    .venv/bin/python benchmarks/partial.py --quick       # smoke size (hf engine, 2 x 2 episodes, 2 steps)
    .venv/bin/python benchmarks/partial.py --alpha 1.0 --base-s 0.1 rollout.num_groups=8
    .venv/bin/python benchmarks/partial.py --workload bugfix   # arl/BugFix-v0 through the proxy, scripted engine
    .venv/bin/python benchmarks/partial.py --workload bugfix-tail  # the same, its test runs heavy-tailed

Three workloads (``--workload``):

``game`` (the default): the demo config's game and model (no warm-start, ``rollout.manager.max_turns`` 4), each
env step followed by a wait that does not block the event loop (as a sandboxed test run or a slow
tool is awaited): the game's own ``step_latency`` option (`arl.envs.text.TextEnv`, awaited by the
managers), ``base_s x scale``, where each episode's ``scale`` is drawn once from a Pareto
distribution with tail index ``--alpha`` (minimum 1, capped at ``--cap``), keyed by the episode's
name (its traj_id), so every mode plays the same episodes' latencies. The override it adds is
printed with the table; any config can set the same.

``bugfix``: configs/tiny_bugfix_proxy.yaml as it is (arl/BugFix-v0, the tiny model, the tool-calling
runner through the in-process proxy, its commands and its hidden-test judge in the sandbox) on the
scripted engine (the config's tool-call script: ``ls``, view, submit, cycled over every request),
no added latency: an episode's env time is what its sandbox commands and its test run take
(``timings["total"]`` - ``"generate"`` - ``"paused"``: everything but the engine and the update's
gate). The tail is the environment's own, whatever it is; the summary line says it.
``engine.backend=vllm`` plays it with the tiny model instead (which calls no tool: every episode
runs to its step limit, whose last step runs the tests).

``bugfix-tail``: ``bugfix`` with the env's heavy-tailed test time on (``test_latency``,
`arl.envs.bugfix.env`: a test suite whose slow test waits, inside its sandboxed process, a
Pareto-distributed time drawn from the task's seed), ``--test-latency ALPHA,SCALE_S,CAP_S``
(default 1.0,2.0,60), and 4 x 2 episodes a step (4 tasks a step, not 2: the tail is one per task,
so twice the tasks give the sync mode 28 of them to draw from). A seed's task waits the same in
every mode; the modes play overlapping seed ranges from 0, not the same sets (spare and partial
launch more groups a step, so they reach further). Under the table: the sync mode's tasks' drawn
waits as well.

One engine serves every mode; each mode trains a fresh policy (the same initial weights) for
``--steps`` steps:

- sync: ``rollout.partial.enabled=false``: every step waits for its slowest episode;
- spare k: ``rollout.spare_groups=k``: the first num_groups whole groups train, the rest are cancelled;
- partial k: ``rollout.partial: {enabled, carry_over_groups: k, max_age}``: the rest carry over.

Columns, per mode: step s (mean wall time of a training step, from ``timing/step_s``; the steps
that also evaluate are left out: the last, and with ``eval.every`` every eval.every-th), x sync
(sync's step s over this one's: the step rate's speed-up), engine busy (``rollout/engine_busy_frac``,
mean; vLLM only), generated / trained / wasted tokens (response tokens the engine returned, those the updates trained, and
generated - trained - those still in flight at the end, i.e. work thrown away; a spare group's
reply cancelled mid-generation is not counted, so spare's waste is a lower bound), age max
(``rollout/partial_age_max``), success % (``rollout/success_rate`` over the trained episodes,
mean). Under the table: the workload's episode env time (median, max, max / median) over the
sync mode's episodes (all of them train there).

Learning curves (issue 50): the same script with the demo's warm-start and its validation panel on,
one seed per launch (``seed=S``); a table of validation success per mode and step follows the first:

    .venv/bin/python benchmarks/partial.py --steps 100 --out partial-learning-s0.json seed=0 sft.steps=30 \
        eval.at_start=true eval.every=50 eval.num_seeds=256 rollout.num_groups=8 rollout.group_size=8 \
        rollout.manager.max_turns=null      # the demo's game: the env's own step limit, not the 4 turns above
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _util import quiet_logs, result_path, table, write_result  # noqa: E402

from arl.envs.latency import ParetoLatency  # noqa: E402

quiet_logs()

REPO = Path(__file__).resolve().parent.parent
RUN_OVERRIDES = ["eval.at_start=false", "eval.every=0", "eval.num_seeds=2", "eval.record_episodes=0",
                 "tensorboard=false", "save_every=0", "sft.steps=0", "rollout.manager.max_turns=4",
                 "rollout.num_groups=4", "rollout.group_size=4", "canary_every=0"]
QUICK_OVERRIDES = ["engine.backend=hf", "rollout.num_groups=2", "rollout.group_size=2", "rollout.manager.max_turns=3"]
# the bugfix workload keeps its config's episode limits (max_turns 4 = the env's max_steps: the last step judges)
BUGFIX_OVERRIDES = [o for o in RUN_OVERRIDES if not o.startswith("rollout.manager.max_turns")] + [
    "engine.backend=scripted", "rollout.num_groups=2", "rollout.group_size=4"]
BUGFIX_QUICK_OVERRIDES = ["rollout.num_groups=1", "rollout.group_size=2"]
TAIL_OVERRIDES = ["rollout.num_groups=4", "rollout.group_size=2"]  # bugfix-tail: more tasks (the tail is per task)
TEST_LATENCY = "1.0,2.0,60"  # bugfix-tail's default --test-latency: alpha, scale_s, cap_s


def parse_test_latency(spec: str) -> ParetoLatency:
    """``ALPHA,SCALE_S,CAP_S`` -> the BugFix env's ``test_latency`` (ValueError on another form or a bad value).

    >>> parse_test_latency("1.0,2.0,60")
    ParetoLatency(alpha=1.0, scale_s=2.0, cap_s=60.0)
    """
    try:
        alpha, scale_s, cap_s = (float(x) for x in spec.split(","))
    except ValueError:
        raise ValueError(f"--test-latency takes ALPHA,SCALE_S,CAP_S (three numbers), got {spec!r}") from None
    return ParetoLatency(alpha=alpha, scale_s=scale_s, cap_s=cap_s)


def latency_override(latency: ParetoLatency) -> str:
    """The config override that turns the env's test latency on (``rollout.manager.env_kwargs``).

    >>> latency_override(ParetoLatency(alpha=1.0, scale_s=2.0, cap_s=60.0))
    'rollout.manager.env_kwargs.test_latency={alpha: 1.0, scale_s: 2.0, cap_s: 60.0}'
    """
    return (f"rollout.manager.env_kwargs.test_latency="
            f"{{alpha: {latency.alpha}, scale_s: {latency.scale_s}, cap_s: {latency.cap_s}}}")


def step_latency_override(base_s: float, alpha: float, cap: float) -> str:
    """The game workload's wait as the config override that turns it on (TextEnv's ``step_latency``,
    one draw per episode): ``base_s`` x a Pareto(``alpha``) scale capped at ``cap``.

    >>> step_latency_override(0.05, 1.2, 40.0)
    'rollout.manager.env_kwargs.step_latency={alpha: 1.2, scale_s: 0.05, cap_s: 2.0, per: episode}'
    """
    return (f"rollout.manager.env_kwargs.step_latency="
            f"{{alpha: {alpha}, scale_s: {base_s}, cap_s: {round(base_s * cap, 12)}, per: episode}}")


def counted_manager(engine: Any, config: Any) -> Any:
    """The manager the config builds, counting the response tokens it is served and the env time of
    every episode that ends: the game's timed env calls (``timings["env"]``, the awaited waits
    included), or, for a proxy episode, whose env steps run inside the agent untimed, its wall
    time less the engine's and the update gate's."""
    from arl.rollout.factory import make_manager

    manager = make_manager(engine, config.rollout)
    manager.generated, manager.env_s, manager.env_seeds = 0, [], []
    generate, run_episode = manager.generate, manager.run_episode

    async def counting_generate(traj, *args, **kwargs):
        gen = await generate(traj, *args, **kwargs)
        manager.generated += sum(len(g.token_ids) for g in (gen if isinstance(gen, list) else [gen]))
        return gen

    async def timed_run_episode(spec):
        episode = await run_episode(spec)
        t = episode.trajectory.timings
        own = None if manager.mode.startswith("proxy") else t.get("env", 0.0)
        manager.env_s.append(own if own is not None else t["total"] - t.get("generate", 0.0) - t.get("paused", 0.0))
        manager.env_seeds.append(spec.seed)
        return episode

    manager.generate, manager.run_episode = counting_generate, timed_run_episode  # what the proxy and scheduler call
    return manager


MODES = {
    "sync": lambda k, age: [],
    "spare": lambda k, age: [f"rollout.spare_groups={k}"],
    "partial": lambda k, age: ["rollout.partial.enabled=true", f"rollout.partial.carry_over_groups={k}",
                               f"rollout.partial.max_age={age}"],
}


async def run(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from arl.config import load_config
    from arl.engine import make_engine
    from arl.rollout.factory import close_manager
    from arl.train import Trainer

    run_overrides = BUGFIX_OVERRIDES if args.workload.startswith("bugfix") else RUN_OVERRIDES

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as out:
        base = load_config(args.config, [*run_overrides, *args.overrides, f"out_dir={out}", "name=engine"])
        engine = make_engine(base.engine)
        try:
            for mode in args.modes:
                name = mode if mode == "sync" else f"{mode} {args.k}"
                config = load_config(args.config, [*run_overrides, *args.overrides, f"out_dir={out}",
                                                   f"name={mode}", f"steps={args.steps + 1}",
                                                   *MODES[mode](args.k, args.max_age)])
                manager = counted_manager(engine, config)
                trained = [0]
                async with Trainer(config, engine=engine, manager=manager) as trainer:
                    await trainer.setup()
                    update = trainer.update

                    def counted(samples, advantages, update=update, trained=trained):
                        trained[0] += sum(s.num_response_tokens for s in samples)
                        return update(samples, advantages)

                    trainer.update = counted
                    started = time.perf_counter()
                    rows = await trainer.train()
                    wall = time.perf_counter() - started
                    in_flight = (sum(trainer.groups.gate.tokens[g] for g in trainer.groups.in_flight)
                                 if trainer.partial else 0)
                await close_manager(manager)  # injected: the trainer leaves it open
                # a step that also evaluates (the last; with eval.every, every eval.every-th) times the evaluation too
                steps = [r for r in rows if "timing/step_s" in r and "eval/success_rate" not in r]

                def mean(key: str, steps: list = steps) -> float | None:
                    values = [r[key] for r in steps if key in r]
                    return statistics.fmean(values) if values else None

                results[name] = {
                    "step_s": [r["timing/step_s"] for r in steps], "step_s_mean": mean("timing/step_s"),
                    "engine_busy": mean("rollout/engine_busy_frac"), "age_max": max(
                        (r.get("rollout/partial_age_max", 0.0) for r in steps), default=0.0),
                    "success": mean("rollout/success_rate"), "generated": manager.generated,
                    "trained": trained[0], "in_flight": in_flight,
                    "wasted": manager.generated - trained[0] - in_flight,
                    "env_s": list(manager.env_s), "env_seeds": list(getattr(manager, "env_seeds", [])), "wall_s": wall,
                    "eval": [[r["step"], r["eval/success_rate"]] for r in rows if "eval/success_rate" in r],
                    "seed": config.seed,
                    "dropped_groups": sum(r.get("rollout/groups_dropped", 0.0) + r.get("rollout/partial_dropped_groups", 0.0)
                                          for r in rows),
                }
        finally:
            await engine.close()
    return results


def drawn_waits(seeds: list[int], latency: ParetoLatency) -> str:
    """The summary line of the test waits the env drew for the sync mode's tasks (one per seed)."""
    from arl.envs.bugfix.judge import latency_key

    waits = [latency.draw_s(latency_key(seed)) for seed in sorted(set(seeds))]
    med = statistics.median(waits)
    return (f"test wait drawn per task (test_latency alpha {latency.alpha}, scale {latency.scale_s} s, cap "
            f"{latency.cap_s} s; sync, {len(waits)} tasks): median {med:.2f} s, max {max(waits):.2f} s, "
            f"max / median {max(waits) / med:.1f}")


HEADER = ["mode", "step s", "x sync", "engine busy %", "generated tok", "trained tok", "wasted tok",
          "groups dropped", "age max", "success %"]


def summarize(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    sync = results.get("sync", {}).get("step_s_mean")
    lines = []
    for name, r in results.items():
        def pct(x: float | None) -> str:
            return "–" if x is None else f"{100 * x:.0f}"
        step = r["step_s_mean"]  # None when every step also evaluated
        lines.append([
            name, "–" if step is None else f"{step:.2f}", f"{sync / step:.2f}" if sync and step else "–",
            pct(r["engine_busy"]),
            str(r["generated"]), str(r["trained"]), str(r["wasted"]), f"{r['dropped_groups']:.0f}",
            f"{r['age_max']:.0f}", pct(r["success"]),
        ])
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.num_groups=8")
    parser.add_argument("--workload", choices=("game", "bugfix", "bugfix-tail"), default="game",
                        help="game: the demo game with a Pareto env wait; bugfix: arl/BugFix-v0's own env time; "
                             "bugfix-tail: bugfix with its test runs heavy-tailed (--test-latency)")
    parser.add_argument("--config", default=None, help="default: the workload's (tiny_frozenlake_gigpo, tiny_bugfix_proxy)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--k", type=int, default=2, help="spare groups / carried-over groups")
    parser.add_argument("--max-age", type=int, default=2, help="rollout.partial.max_age")
    parser.add_argument("--steps", type=int, default=6, help="measured training steps per mode")
    parser.add_argument("--base-s", type=float, default=0.05, help="env wait per step of a scale-1 episode")
    parser.add_argument("--alpha", type=float, default=1.2, help="Pareto tail index of the per-episode scale")
    parser.add_argument("--cap", type=float, default=40.0, help="the largest scale")
    parser.add_argument("--test-latency", default=None, metavar="ALPHA,SCALE_S,CAP_S",
                        help=f"bugfix-tail: the env's test_latency (default {TEST_LATENCY}); with --workload bugfix, "
                             "turns it on there (its 2 x 4 episodes)")
    parser.add_argument("--quick", action="store_true", help="smoke size: hf engine, 2 x 2 episodes, 2 steps")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/partial.json")
    args = parser.parse_args()
    if args.config is None:
        name = "tiny_bugfix_proxy" if args.workload.startswith("bugfix") else "tiny_frozenlake_gigpo"
        args.config = str(REPO / "configs" / f"{name}.yaml")
    if args.workload == "game" and args.test_latency is not None:
        parser.error("--test-latency is the BugFix env's: use it with --workload bugfix or bugfix-tail")
    if args.workload == "bugfix-tail":
        args.test_latency = args.test_latency or TEST_LATENCY
    latency, workload = None, []  # the workload's overrides: before --quick's, which come before the user's
    if args.test_latency is not None:
        try:
            latency = parse_test_latency(args.test_latency)
        except ValueError as exc:
            parser.error(str(exc))
        workload = [*(TAIL_OVERRIDES if args.workload == "bugfix-tail" else []), latency_override(latency)]
    quick = []
    if args.quick:
        quick = BUGFIX_QUICK_OVERRIDES if args.workload.startswith("bugfix") else QUICK_OVERRIDES
        args.steps, args.base_s = 2, 0.02
    if args.workload == "game":
        workload = [step_latency_override(args.base_s, args.alpha, args.cap)]
    args.overrides = [*workload, *quick, *args.overrides]
    started = time.perf_counter()
    results = asyncio.run(run(args))
    lines = summarize(results)
    if args.workload.startswith("bugfix"):
        print(f"Partial rollouts, {Path(args.config).name} {' '.join(args.overrides)}: the env's own time "
              f"(sandbox commands, hidden tests), {args.steps} measured steps per mode")
    else:
        print(f"Partial rollouts, {Path(args.config).name} {' '.join(args.overrides)}: env wait {args.base_s} s x "
              f"Pareto({args.alpha}) per episode (cap {args.cap}), {args.steps} measured steps per mode")
    print(table(HEADER, lines))
    # a curve: eval.at_start / eval.every set (the run's last step always evaluates, on its own no curve)
    curves = {name: r["eval"] for name, r in results.items() if len(r["eval"]) > 1}
    if curves:  # eval.every / eval.at_start set: the learning curve of each mode
        steps = sorted({step for curve in curves.values() for step, _ in curve})
        seed = next(iter(results.values()))["seed"]  # every mode runs the same config seed
        print(f"validation success % (seed {seed}; eval.num_seeds levels) at step:")
        print(table(["mode", *map(str, steps)], [[name, *(next((f"{100 * v:.1f}" for t, v in curve if t == step), "–")
                                                         for step in steps)] for name, curve in curves.items()]))
    if "sync" in results and results["sync"]["env_s"]:
        env = results["sync"]["env_s"]
        med = statistics.median(env)
        print(f"episode env time (sync, {len(env)} episodes): median {med:.2f} s, max {max(env):.2f} s, "
              f"max / median {max(env) / med:.1f}")
    if latency is not None and results.get("sync", {}).get("env_seeds"):
        print(drawn_waits(results["sync"]["env_seeds"], latency))
    name = {"bugfix": "partial-bugfix", "bugfix-tail": "partial-bugfix-tail"}.get(args.workload, "partial")
    write_result(args.out or result_path(name, args.quick), args, {"results": results, "table": lines}, started)


if __name__ == "__main__":
    main()
