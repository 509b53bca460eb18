"""verl's own training loop (``python -m verl.trainer.main_ppo``) on the CPU with arl inside it.

Runs `arl/integrations/verl/examples/cpu_fit.sh` twice in a fresh directory: 3 steps of FrozenLake
GiGPO with the tiny model (2 logical workers: FSDP2 actor and reference over gloo, arl's HF engine as
the rollout replica), a checkpoint at steps 2 and 3; then the same launch with ``STEPS=4``, which
resumes from step 3 and runs step 4. It asserts what verl's console metrics and logs say about each
stage, not only the exit code.

Slow (a few minutes per run on 2 cores; Ray, FSDP and the rollout servers start twice): it runs only
with ``ARL_VERL_FIT=1`` (``make verl-fit``).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "arl/integrations/verl/examples/cpu_fit.sh"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("ARL_VERL_FIT") != "1", reason="verl's CPU fit runs with ARL_VERL_FIT=1"),
]

_STEP = re.compile(r"\bstep:(\d+) - (.*)$")
_NUMBER = re.compile(r"^(?:np\.\w+\()?(-?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))\)?$")


def step_metrics(log: str) -> dict[int, dict[str, float]]:
    """verl's console logger lines (``step:N - key:value - ...``) as {step: {key: value}}."""
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        match = _STEP.search(line)
        if match is None:
            continue
        metrics = {}
        for item in match.group(2).split(" - "):
            key, _, value = item.rpartition(":")
            number = _NUMBER.match(value.strip())
            if key and number:
                metrics[key.strip()] = float(number.group(1))
        steps[int(match.group(1))] = metrics
    return steps


def run_fit(out: Path, steps: int) -> str:
    env = {**os.environ, "OUT": str(out), "STEPS": str(steps), "PYTHON": sys.executable}
    try:
        proc = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    finally:
        subprocess.run([str(Path(sys.executable).parent / "ray"), "stop", "--force"], capture_output=True, timeout=120)
    log = proc.stdout + proc.stderr
    (out / f"fit_{steps}.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    return log


@pytest.fixture(scope="module")
def fit(tmp_path_factory):
    out = tmp_path_factory.mktemp("verl_cpu_fit")
    first = run_fit(out, 3)
    latest = (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip()
    resumed = run_fit(out, 4)
    return out, first + f"\nlatest checkpoint after the first launch: {latest}\n", resumed


def check_step(step: int, m: dict[str, float]) -> None:
    # rollout: arl's episodes through ArlAgentLoop on the arl_hf replica
    assert m["response_length/mean"] > 0 and m["num_turns/mean"] >= 2, m
    # old log-probs: verl's own check that the replica served the actor's weights (fp32 both sides)
    assert m["training/rollout_probs_diff_max"] < 1e-3, m
    assert m["training/rollout_actor_probs_pearson_corr"] > 0.999, m
    # reference log-probs and the KL loss, the entropy, the policy loss (FSDP2 update over gloo)
    for key in ("actor/kl_loss", "actor/entropy", "actor/pg_loss", "actor/loss", "actor/grad_norm"):
        assert math.isfinite(m[key]), (key, m)
    assert m["actor/grad_norm"] > 0 and m["actor/entropy"] > 0, m
    # GiGPO advantages (arl_sync), verl's rollout correction on them (rollout_is=token)
    assert m["arl_gigpo/anchor_groups"] >= 1, m
    assert abs(m["rollout_corr/rollout_is_mean"] - 1.0) < 1e-3, m
    # samples of step t come from the weights synced after step t-1: verl's staleness is 0
    assert m["training/off_policy/trajectory_staleness/max"] == 0, m
    # the weight sync after this step (verl naive sync into arl_hf), checked by arl's canary
    assert m["arl_sync/weight_version"] == step, m
    assert m["arl_sync/canary_max_abs"] < 1e-2 and m["arl_sync/canary_mean_abs"] < 2e-3, m
    assert m["training/global_step"] == step, m


def test_three_steps_then_a_checkpoint(fit):
    out, first, _ = fit
    steps = step_metrics(first)
    assert sorted(steps) == [1, 2, 3]
    for step, metrics in steps.items():
        check_step(step, metrics)
    assert "Training from scratch" in first
    ckpt = out / "checkpoints"
    assert "latest checkpoint after the first launch: 3" in first
    for step in (2, 3):
        actor = ckpt / f"global_step_{step}" / "actor"
        assert sorted(p.name for p in actor.glob("model_world_size_2_rank_*.pt")) == [
            "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
        assert (ckpt / f"global_step_{step}" / "data.pt").is_file()
    assert all(steps[s]["actor/lr"] > 0 for s in steps)  # with grad_norm > 0: the weights moved each step
    # the actor starts as the reference and drifts from it as it trains
    assert steps[1]["actor/kl_loss"] < 1e-6 < steps[2]["actor/kl_loss"] < steps[3]["actor/kl_loss"]


def test_resume_continues_from_the_checkpoint(fit):
    out, _, resumed = fit
    assert f"Resuming from {out / 'checkpoints' / 'global_step_3'}" in resumed
    steps = step_metrics(resumed)
    assert sorted(steps) == [4]
    check_step(4, steps[4])
    # the actor continues from step 3 (a fresh start would be at the reference again: KL 0)
    assert steps[4]["actor/kl_loss"] > 1e-3
    assert (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
