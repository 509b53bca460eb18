"""`arl eval` end to end: a zoo model on a game's validation panel, in both prompt styles."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("style", ["compact", "full"])
def test_eval_prints_the_validation_metrics(style):
    proc = subprocess.run(
        [sys.executable, "-m", "arl.cli", "eval", "tiny", "--backend", "hf", "--num-seeds", "2",
         "--prompt-style", style],
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
