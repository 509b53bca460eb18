"""The terminal player (fed through a non-TTY stdin) and the benchmark script's smoke run."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from arl.envs import play

ROOT = Path(__file__).resolve().parents[2]


def run_play(monkeypatch, capsys, argv: list[str], stdin: str) -> str:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert play.main(argv) == 0
    return capsys.readouterr().out


def test_play_reads_keys_names_and_quits(monkeypatch, capsys):
    # Seed 3: player below the box, target two cells above it (solved by w, d, a, w).
    out = run_play(monkeypatch, capsys, ["arl/Sokoban-v0", "--seed", "3"], "d\nfoo\nleft\n\x1b[A\nq\nw\n")
    assert "You are solving the Sokoban puzzle." in out
    assert "Unknown input" in out and "Bye." in out
    assert "step 3/10" in out and "step 4/10" not in out  # q stopped it before the last w
    assert "Right\n" in out and "Left\n" in out and "Up\n" in out
    assert "Episode finished" not in out


def test_play_stops_at_the_step_limit(monkeypatch, capsys):
    out = run_play(monkeypatch, capsys, ["arl/FrozenLake-v0", "--seed", "0"], "aaaaaaaaaaaaaaaaaaaa\n")
    assert "Episode finished" in out
    assert "step 11/10" not in out


def test_play_key_string_moves_match_env(monkeypatch, capsys):
    out = run_play(monkeypatch, capsys, ["arl/Sokoban-v0", "--seed", "3"], "wdaw\n")
    assert "Episode finished: solved! Return 10.60 in 4 steps." in out


def test_benchmark_quick_runs(tmp_path):
    out = tmp_path / "envs.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "envs.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "arl/Sokoban-v0 | TextEnv" in proc.stdout and "FrozenLake-v1 (gymnasium)" in proc.stdout
    report = json.loads(out.read_text())
    assert report["quick"] is True
    wrappers = {(r["env"], r["wrapper"]) for r in report["results"]}
    assert ("arl/Sokoban-10x10-v0", "ToolEnv") in wrappers and len(wrappers) == 1 + 6 * 3
    sokoban = next(r for r in report["results"] if r["env"] == "arl/Sokoban-v0" and r["wrapper"] == "raw")
    assert sokoban["reset"]["median_us"] < 50_000
