"""`arl eval` end to end: a zoo model on a game's validation panel, in both prompt styles and
through the proxy; `arl demo` never reuses a run directory; `arl train` checks a config's names
before it builds anything, prints a config, takes flags anywhere; `arl --help` names every command."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest


@pytest.mark.parametrize(("style", "mode"), [("compact", "step"), ("full", "step"), ("compact", "proxy")])
def test_eval_prints_the_validation_metrics(style, mode):
    proc = subprocess.run(
        [sys.executable, "-m", "arl.cli", "eval", "tiny", "--backend", "hf", "--num-seeds", "2",
         "--prompt-style", style, "--mode", mode],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    values = dict(line.split() for line in proc.stdout.splitlines() if line.startswith("eval/"))
    assert float(values["eval/num_episodes"]) == 2
    assert 0.0 <= float(values["eval/success_rate"]) <= 1.0


def test_eval_rejects_an_unknown_prompt_style():
    proc = subprocess.run([sys.executable, "-m", "arl.cli", "eval", "tiny", "--prompt-style", "tiny"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_eval_takes_a_training_configs_game_prompts_and_env_kwargs():
    from arl.cli import build_parser, eval_rollout

    parse = build_parser().parse_args
    smol = eval_rollout(parse(["eval", "m", "--config", "smollm2_frozenlake_gigpo"]))
    assert smol.mode == "step" and smol.manager.prompt_style == "compact" and smol.manager.system_prompt == ""
    assert smol.manager.env_kwargs == {"cell_separator": " ", "surroundings": True}
    assert smol.manager.temperature == 0.5  # eval's T
    assert smol.num_groups == smol.group_size == 1
    mixed = eval_rollout(parse(["eval", "m", "--config", "smollm2_frozenlake_gigpo", "--temperature", "0",
                                "--env-kwargs", "{}", "--env", "arl/Sokoban-v0"]))
    assert mixed.manager.temperature == 0 and mixed.manager.env_kwargs == {} and mixed.env_id == "arl/Sokoban-v0"
    plain = eval_rollout(parse(["eval", "m"]))
    assert (plain.env_id, plain.mode, plain.manager.prompt_style, plain.manager.max_tokens) == (
        "arl/FrozenLake-v0", "step", "full", 8)


def test_eval_checks_the_game_and_the_configs_runner_before_an_engine_starts():
    from arl.cli import build_parser, eval_rollout
    from arl.config import ConfigError

    parse = build_parser().parse_args
    with pytest.raises(ConfigError, match=r"unknown env id 'arl/NoSuch-v0'.* @ rollout.env_id"):
        eval_rollout(parse(["eval", "m", "--env", "arl/NoSuch-v0"]))
    # a proxy config's own runner is the one evaluated (it was the default gym runner before)
    bugfix = eval_rollout(parse(["eval", "m", "--config", "tiny_bugfix_proxy"]))
    assert bugfix.mode == "proxy" and bugfix.proxy.runner != "gym"
    proc = subprocess.run([sys.executable, "-m", "arl.cli", "eval", "tiny", "--backend", "scripted",
                           "--env", "arl/NoSuch-v0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "@ rollout.env_id" in proc.stderr


def test_demo_picks_a_free_run_directory(tmp_path):
    from arl.config import DEMO_CONFIG, load_config
    from arl.train.run_dir import free_run_name

    config = load_config(DEMO_CONFIG, [f"out_dir={tmp_path}"])
    assert free_run_name(config) == "tiny_frozenlake_gigpo"
    (tmp_path / "tiny_frozenlake_gigpo").mkdir()
    (tmp_path / "tiny_frozenlake_gigpo-2").mkdir()
    assert free_run_name(config) == "tiny_frozenlake_gigpo-3"


def test_the_command_line_reruns_itself_with_the_fast_allocator(monkeypatch):
    """tcmalloc + Intel's OpenMP must be in LD_PRELOAD before the process starts: `arl` re-runs
    itself once with them where both exist (never when told not to, never twice)."""
    from arl import cli

    calls = []
    monkeypatch.setattr(cli.os, "execve", lambda path, argv, env: calls.append((argv, env)))
    monkeypatch.setattr(cli, "preload_libraries", lambda: ["libtcmalloc_minimal.so.4", "/v/lib/libiomp5.so"])
    monkeypatch.delenv("ARL_PRELOADED", raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/mine.so")
    monkeypatch.setattr(cli.sys, "argv", ["arl", "train", "x"])
    cli._reexec_with_preload()
    (argv, env), = calls
    assert argv[1:] == ["-m", "arl.cli", "train", "x"]
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4:/v/lib/libiomp5.so:/mine.so" and env["ARL_PRELOADED"] == "1"
    monkeypatch.setenv("ARL_PRELOADED", "1")  # the re-run itself
    cli._reexec_with_preload()
    monkeypatch.delenv("ARL_PRELOADED")
    monkeypatch.setenv("ARL_PRELOAD", "0")  # switched off
    cli._reexec_with_preload()
    assert len(calls) == 1


@pytest.mark.vllm
def test_eval_on_vllm_prints_only_its_results():
    """The terminal gets results, not library chatter: vLLM's start-up notes, torch's C++ warnings and
    torch's own loggers (which write to stderr through handlers of their own) stay off it."""
    proc = subprocess.run([sys.executable, "-m", "arl.cli", "eval", "tiny", "--num-seeds", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""
    assert "eval/success_rate" in proc.stdout


def test_torch_log_records_go_to_the_log_file_not_the_terminal(tmp_path, capsys):
    import logging

    import torch  # noqa: F401  (creates torch's loggers with their own stderr handlers)

    from arl.cli import route_torch_logs, setup_logging

    torch_loggers = {name: (lg, list(lg.handlers), lg.propagate) for name, lg in logging.root.manager.loggerDict.items()
                     if isinstance(lg, logging.Logger) and (name == "torch" or name.startswith("torch."))}
    try:
        setup_logging(0, tmp_path / "arl.log")
        route_torch_logs()
        logging.getLogger("torch._library.triton").warning("Triton not available (test)")
        logging.getLogger("arl.test").warning("arl says this once")
        err = capsys.readouterr().err
        assert "Triton" not in err and "arl says this once" in err
        assert "Triton not available (test)" in (tmp_path / "arl.log").read_text()
    finally:
        for lg, handlers, propagate in torch_loggers.values():
            lg.handlers[:] = handlers
            lg.propagate = propagate


# -- arl train: checks first, --print-config, flags anywhere, help that says where the run goes ----


def test_train_checks_the_names_a_config_gives_before_it_builds_or_writes_anything(tmp_path, monkeypatch, capsys):
    """An unknown env id used to start the engine, fail in the first rollout and leave a
    metrics.jsonl that refused the retry until --overwrite; gymnasium's `module:id` form names a
    game in the user's own module, which the check imports (where it registers itself)."""
    import json

    from outside_arl import LAMPS_GAME, arl_main, one_cheap_step, user_module

    mod = user_module(tmp_path, monkeypatch, LAMPS_GAME)
    assert arl_main("train", "tiny_frozenlake_gigpo", *one_cheap_step(tmp_path), "rollout.env_id=arl/Nope-v0") == 2
    err = capsys.readouterr().err
    assert "unknown env id 'arl/Nope-v0'" in err and err.rstrip().endswith("@ rollout.env_id"), err
    assert not (tmp_path / "t").exists()  # no run directory, no log, nothing to --overwrite
    assert arl_main("train", "tiny_frozenlake_gigpo", *one_cheap_step(tmp_path), f"rollout.env_id={mod}:mine/Lamps-v0",
                    "engine.scripted={actions: [Light, Wait]}") == 0
    rows = [json.loads(line) for line in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert any(f"env/{mod}:mine/Lamps-v0/success_rate" in row for row in rows)


def test_print_config_prints_the_config_as_yaml_and_builds_nothing(tmp_path, capsys):
    from outside_arl import arl_main

    from arl.config import load_config

    overrides = [f"out_dir={tmp_path}", "name=p", "steps=3", "algo.estimator=grpo"]
    assert arl_main("train", "tiny_frozenlake_gigpo", *overrides[:2], "--print-config", *overrides[2:]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "printed.yaml").write_text(printed)
    assert load_config(tmp_path / "printed.yaml") == load_config("tiny_frozenlake_gigpo", overrides)
    assert printed.startswith("name: p\n") and "estimator: grpo" in printed
    assert not (tmp_path / "p").exists()


def test_train_takes_flags_and_overrides_in_any_order():
    from arl.cli import parse_args

    for argv in (["train", "a.yaml", "steps=3", "--resume"], ["train", "--resume", "a.yaml", "steps=3"],
                 ["train", "a.yaml", "--resume", "steps=3"], ["train", "steps=3", "--resume", "a.yaml"]):
        args = parse_args(argv)
        assert (args.config, args.overrides, args.resume) == ("a.yaml", ["steps=3"], True), argv
    args = parse_args(["train", "a.yaml", "x=1", "--overwrite", "x=2", "-v", "--print-config"])
    assert args.overrides == ["x=1", "x=2"] and args.overwrite and args.print_config and args.verbose == 1
    assert parse_args(["-v", "demo", "steps=2"]).verbose == 1
    for bad in (["train", "a.yaml", "--resume", "--nope"], ["train", "steps=3"], ["train", "a.yaml", "b.yaml"],
                ["eval", "tiny", "steps=3"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_help_lists_every_command_and_train_says_where_the_run_goes(capsys):
    from arl.cli import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    top = capsys.readouterr().out
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        line = next((row for row in top.splitlines() if row.split()[:1] == [name]), None)
        assert line is not None and len(line.split()) > 3, f"`arl --help` has no line for {name!r}"
        assert sub.description, name
    import arl.cli

    documented = {line.split()[1] for line in arl.cli.__doc__.splitlines() if line.strip().startswith("arl ")}
    assert documented == set(commands.choices)
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--help"])
    train = " ".join(capsys.readouterr().out.split())
    assert all(w in train for w in ("OUT_DIR/NAME", "out_dir", "name", "--resume", "--overwrite", "--print-config",
                                    "package.module:name"))
