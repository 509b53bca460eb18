"""Metrics logging: JSONL rows, TensorBoard scalars, non-finite values, resume truncation, curves."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from arl.train.logging import MetricsLogger, plot_learning_curve, progress, read_metrics


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_rows_round_trip_and_tensorboard(tmp_path: Path, capsys):
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, {"eval/success_rate": 0.25, "env/frozenlake/success_rate": 0.5})
        logger.log(1, {"train/loss": np.float32(1.5), "train/grad_norm": torch.tensor(2.0),
                       "timing/step_s": 3, "rollout/clipped": True})
        logger.log(2, {"rollout": {"success_rate": 0.75}})  # nested -> "rollout/success_rate"

    assert read_metrics(tmp_path) == [
        {"step": 0, "eval/success_rate": 0.25, "env/frozenlake/success_rate": 0.5},
        {"step": 1, "train/loss": 1.5, "train/grad_norm": 2.0, "timing/step_s": 3, "rollout/clipped": True},
        {"step": 2, "rollout/success_rate": 0.75},
    ]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    tb = _scalars(tmp_path)
    assert tb["env/frozenlake/success_rate"] == [(0, 0.5)]
    assert tb["train/grad_norm"] == [(1, 2.0)]
    assert tb["rollout/clipped"] == [(1, 1.0)]
    assert tb["rollout/success_rate"] == [(2, 0.75)]
    assert capsys.readouterr() == ("", "")


def test_each_row_is_on_disk_before_close(tmp_path: Path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(3, {"train/loss": 1.0})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 3, "train/loss": 1.0}
    logger.close()
    assert not (tmp_path / "tb").exists()


def test_non_finite_and_non_numeric_values(tmp_path: Path):
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, {"train/loss": math.nan, "train/kl": math.inf, "train/ok": 1.0,
                       "eval/note": "skipped", "eval/none": None, "train/t": torch.tensor(float("-inf"))})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    assert read_metrics(tmp_path) == [{"step": 0, "train/loss": None, "train/kl": None, "train/ok": 1.0,
                                      "eval/note": "skipped", "eval/none": None, "train/t": None}]
    assert set(_scalars(tmp_path)) == {"train/ok"}
    with MetricsLogger(tmp_path, tensorboard=False) as logger, pytest.raises(ValueError, match="reserved"):
        logger.log(1, {"step": 2})


def test_resume_drops_rows_after_the_checkpoint(tmp_path: Path):
    with MetricsLogger(tmp_path) as logger:
        for step in range(6):
            logger.log(step, {"train/loss": float(step)})
    # The interrupted run tore its last line.
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "train/lo')

    with MetricsLogger(tmp_path, resume_step=3) as logger:
        assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
        logger.log(4, {"train/loss": 40.0})
    assert read_metrics(tmp_path) == [{"step": s, "train/loss": float(s)} for s in range(4)] + [
        {"step": 4, "train/loss": 40.0}
    ]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # TensorBoard hides the interrupted run's steps 4 and 5.
    assert _scalars(tmp_path)["train/loss"] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_read_metrics_without_a_file(tmp_path: Path):
    assert read_metrics(tmp_path) == []
    assert read_metrics(tmp_path / "missing") == []


def _rows(n: int, rate: float) -> list[dict]:
    return [{"step": s, "rollout/success_rate": min(1.0, rate * s), "train/loss": 2.0 / (s + 1),
             "eval/success_rate": (rate * s if s % 5 == 0 else None)} for s in range(n)]


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_learning_curve_png(tmp_path: Path, capsys):
    run = tmp_path / "frozenlake-gigpo"
    with MetricsLogger(run, tensorboard=False) as logger:
        for row in _rows(21, 0.04):
            logger.log(row["step"], {k: v for k, v in row.items() if k != "step"})
    out = plot_learning_curve(run, run / "curve.png")
    assert out == run / "curve.png" and _is_png(out)

    # Several runs on the same axes; a key no run has is skipped.
    both = plot_learning_curve({"gigpo": run, "grpo": _rows(21, 0.02)}, tmp_path / "cmp" / "both.png",
                               keys=("eval/success_rate", "rollout/success_rate", "missing/key"))
    assert _is_png(both)
    # Nothing to draw still gives a (labelled, empty) figure rather than an error.
    assert _is_png(plot_learning_curve([], tmp_path / "empty.png"))
    assert capsys.readouterr() == ("", "")


def test_progress_bar_is_silent_when_disabled(capsys):
    assert list(progress(range(3), desc="steps", disable=True)) == [0, 1, 2]
    assert capsys.readouterr() == ("", "")
