"""What a run directory holds besides checkpoints, and the rule that nothing deletes it implicitly.

A run directory (``config.run_dir``) holds checkpoints (`arl.train.checkpoint`), metrics.jsonl,
tb/, the learning curve, arl.log, the resolved config (`CONFIG_FILE`, `save_config`: what `arl view`
shows; a checkpoint's trainer_state.pt also holds it, but reading that needs the pickle of its
optimizer state) and, when the KL reference is the warm-started policy, that
reference (`REFERENCE_FILE`: checkpoints hold only the policy, and a resumed run must anchor to
the same policy, not to the initial model it is rebuilt from). A fresh run starts only in a
directory with no earlier run in it (`check_fresh`), or when told to overwrite it. A start that
failed before its first training step (no checkpoint, no metrics row of a step >= 1: a set-up,
warm-start or first rollout that raised) is no run: a retry replaces what it left (`run_artifacts`).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from arl.config import RunExistsError, to_yaml
from arl.train.episodes import EPISODES_FILE

log = logging.getLogger(__name__)

REFERENCE_FILE = "reference.pt"  # the KL reference policy's state dict, when it is not the initial model
CONFIG_FILE = "config.yaml"  # the run's resolved config, rewritten by every set-up (a resume's own overrides)


def run_artifacts(run_dir: Path) -> list[str]:
    """What in ``run_dir`` belongs to an earlier run (checkpoints, metrics, the KL reference).

    Nothing when it holds no checkpoint and no metrics row of a training step (step >= 1): a start
    that failed before its first step (an empty metrics.jsonl, or only the warm-start's and the
    first evaluation's step-0 rows) has nothing to resume, and would otherwise block its own retry
    until ``--overwrite``; `check_fresh` removes what it left."""
    if not run_dir.is_dir():
        return []
    ckpts = sorted(p.name for p in run_dir.glob("ckpt_*"))
    if not ckpts and not _trained(run_dir / "metrics.jsonl"):
        return []
    found = [f"{len(ckpts)} checkpoint(s): {', '.join(ckpts[-3:])}"] if ckpts else []
    found += [name for name in ("metrics.jsonl", EPISODES_FILE, REFERENCE_FILE) if (run_dir / name).exists()]
    return found


def _trained(metrics: Path) -> bool:
    """Does ``metrics`` (a metrics.jsonl) hold a row of a training step? A line that does not
    parse counts as one: a file arl cannot read is never taken for an empty start."""
    if not metrics.exists():
        return False
    with metrics.open(encoding="utf-8") as f:
        for line in f:  # step 1's row comes after a few step-0 rows: this reads little of a real run
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                return True
            if not isinstance(row, dict) or not isinstance(row.get("step"), int) or row["step"] >= 1:
                return True
    return False


def free_run_name(config: Any) -> str:
    """``config.name``, or ``name-2``, ``name-3``, ... : the first that has no run directory yet
    (`arl demo` never resumes or overwrites an earlier run)."""
    base, k = config.name, 1
    name = base
    while (Path(config.out_dir) / name).exists():
        k += 1
        name = f"{base}-{k}"
    return name


def check_fresh(run_dir: Path, overwrite: bool) -> None:
    """Refuse (`RunExistsError`, naming both ways out) to start a fresh run where a run is, unless
    ``overwrite``: then delete that run's files, and only those. What a start that failed before
    its first training step left (`run_artifacts`: no run) is deleted the same way, with a warning."""
    found = run_artifacts(run_dir)
    if found and not overwrite:
        raise RunExistsError(
            f"{run_dir} already holds a run ({', '.join(found)}); nothing was changed. Either resume it "
            f"(`arl train CONFIG --resume`, or Trainer(config, resume=True)) or start over and delete it "
            f"(`arl train CONFIG --overwrite`, or overwrite=true in the config)"
        )
    # episodes.jsonl too: an overwritten run's evaluations would otherwise stay in the new run's report
    files = [run_dir / "metrics.jsonl", run_dir / EPISODES_FILE, run_dir / "learning_curve.png",
             run_dir / REFERENCE_FILE, run_dir / CONFIG_FILE]
    dirs = [run_dir / "tb", *run_dir.glob("ckpt_*")]
    if found:
        log.warning("overwriting the run in %s (%s)", run_dir, ", ".join(found))
    elif leftovers := [p.name for p in files + dirs if p.exists()]:
        log.warning("removing what a start that failed before its first training step left in %s (%s)",
                    run_dir, ", ".join(leftovers))
    for path in files:
        path.unlink(missing_ok=True)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)


def save_config(run_dir: Path, config: Any) -> Path:
    """``config`` (a `TrainConfig`, as resolved: ``optim.precision`` "auto" already bf16 or fp32) as
    run_dir/config.yaml, written atomically; returns its path. Plain YAML, so `arl view` and a
    reader read it without arl's classes, and `load_config` reads it back."""
    path = run_dir / CONFIG_FILE
    tmp = run_dir / f".tmp-{CONFIG_FILE}"
    tmp.write_text(to_yaml(config), encoding="utf-8")
    tmp.replace(path)
    return path


def save_reference(run_dir: Path, model: Any) -> None:
    """The KL reference's weights into the run directory (written atomically)."""
    tmp = run_dir / f".tmp-{REFERENCE_FILE}"
    torch.save(model.state_dict(), tmp)
    tmp.replace(run_dir / REFERENCE_FILE)


def load_reference(run_dir: Path, model: Any, *, warm_started: bool) -> bool:
    """Load the saved KL reference into ``model``; False (with a warning when the run was
    warm-started, so the reference should have been saved) when there is none."""
    path = run_dir / REFERENCE_FILE
    if path.exists():
        model.load_state_dict(torch.load(path, map_location=next(model.parameters()).device))
        return True
    if warm_started:
        log.warning("resuming without %s: the KL reference is the initial model, not the warm-started policy", path)
    return False


__all__ = ["CONFIG_FILE", "REFERENCE_FILE", "check_fresh", "free_run_name", "load_reference", "run_artifacts",
           "save_config", "save_reference"]
