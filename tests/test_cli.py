"""`arl eval` end to end: a zoo model on a game's validation panel, in both prompt styles and
through the proxy; `arl demo` never reuses a run directory."""

from __future__ import annotations

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


def test_demo_picks_a_free_run_directory(tmp_path):
    from arl.config import load_config
    from arl.demo import DEMO_CONFIG, free_run_name

    config = load_config(DEMO_CONFIG, [f"out_dir={tmp_path}"])
    assert free_run_name(config) == "tiny_frozenlake_gigpo"
    (tmp_path / "tiny_frozenlake_gigpo").mkdir()
    (tmp_path / "tiny_frozenlake_gigpo-2").mkdir()
    assert free_run_name(config) == "tiny_frozenlake_gigpo-3"
