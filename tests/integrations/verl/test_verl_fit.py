"""verl's own training loop (``python -m verl.trainer.main_ppo``) on the CPU with arl inside it.

Runs `arl/integrations/verl/examples/cpu_fit.sh` twice in a fresh directory: 3 steps of FrozenLake
GiGPO with the tiny model (2 logical workers: FSDP2 actor and reference over gloo, arl's HF engine as
the rollout replica), a checkpoint at steps 2 and 3; then the same launch with ``STEPS=4``, which
resumes from step 3 and runs step 4. It asserts what verl's console metrics, logs and files (its
checkpoints, its per-step rollout dump ``trainer.rollout_data_dir``) say about each stage, not only the
exit code: the resumed step draws the prompts an uninterrupted run would have drawn at step 4.

Slow (a few minutes on 2 cores; Ray, FSDP and the rollout servers start twice). Part of `make test`
(and alone: `make verl-fit`); ``ARL_SKIP_VERL_FIT=1`` skips it, and pytest's summary says so.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from arl.integrations.verl.console import step_metrics

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "arl/integrations/verl/examples/cpu_fit.sh"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("ARL_SKIP_VERL_FIT") == "1",
                       reason="verl's CPU fit skipped on request (ARL_SKIP_VERL_FIT=1); `make verl-fit` runs it"),
]
DATA_SEED, GROUPS, GROUPS_PER_STEP, GROUP = 0, 64, 2, 2  # cpu_fit.sh's defaults (data.seed, dataset, batch, n)

_SYNC = re.compile(r"arl_hf replica 0: weights of global step (\d+) loaded \(engine version (\d+)\); "
                   r"canary gap max (\S+) mean (\S+)$")


def syncs(log: str) -> list[tuple[int, int, float, float]]:
    """Every weight sync the arl_hf replica logged: (global step, engine version, canary gap max, mean)."""
    return [(int(m[1]), int(m[2]), float(m[3]), float(m[4]))
            for m in (_SYNC.search(line) for line in log.splitlines()) if m]


def run_fit(out: Path, steps: int) -> str:
    env = {**os.environ, "OUT": str(out), "STEPS": str(steps), "PYTHON": sys.executable}
    # its own session: verl's driver starts Ray's processes in its process group, and whatever is left of
    # them when the launch ends (or times out) is killed by that group's id, not by name
    proc = subprocess.Popen(["bash", str(SCRIPT), f"trainer.rollout_data_dir={out / 'rollouts'}"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=1200)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.returncode is None:
            log = proc.communicate()[0]
    (out / f"fit_{steps}.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    return log


def _observation(prompt: str) -> str:
    """The first observation in an episode's prompt (arl's traj prompt: ``Observation:\n<grid>\nStrictly ...``)."""
    return prompt.split("Observation:\n", 1)[1].split("\nStrictly", 1)[0]


def drawn_seeds(out: Path, step: int) -> list[int]:
    """The seeds whose prompts verl's rollout dump of ``step`` holds, sorted (verl sorts the dump by
    the rows' random uids; each row's ``rollout.n`` episodes share its prompt). A prompt is matched to the dataset row with the same opening
    observation (every FrozenLake seed's differs; the agent loop writes its own instructions around it)."""
    import pandas as pd

    rows = pd.read_parquet(out / "data" / "train.parquet")
    firsts = {row["extra_info"]["seed"]: _observation(row["prompt"][-1]["content"]) for _, row in rows.iterrows()}
    assert len(set(firsts.values())) == len(firsts)  # the match below is unambiguous
    seeds = []
    lines = (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()
    assert len(lines) == GROUPS_PER_STEP * GROUP, lines
    for line in lines:
        prompt = json.loads(line)["input"]
        found = [seed for seed, first in firsts.items() if first == _observation(prompt)]
        assert len(found) == 1, (step, prompt[-400:], found)
        seeds.append(found[0])
    assert all(seeds.count(seed) == GROUP for seed in seeds), seeds
    return sorted(set(seeds))


def uninterrupted_seeds(steps: int) -> list[list[int]]:
    """The seeds an uninterrupted run draws at steps 1..``steps``: verl's own sampler
    (`create_rl_sampler`, seeded by ``data.seed``) under the StatefulDataLoader verl's trainer builds
    (``batch_size=train_batch_size``, ``drop_last``), over the dataset's row indices (row i: seed i)."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler

    rows = list(range(GROUPS))
    sampler = create_rl_sampler(OmegaConf.create({"shuffle": True, "seed": DATA_SEED}), rows)
    loader = StatefulDataLoader(rows, batch_size=GROUPS_PER_STEP, drop_last=True, sampler=sampler)
    return [sorted(int(i) for i in batch) for batch in itertools.islice(loader, steps)]


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
    # the weight version of the samples: every episode of step t ran on the weights synced after step t-1
    # (verl's tags min/max_global_steps: staleness (t-1) - max and (t-1) - min both 0, one version each)
    for key in ("trajectory_staleness", "trajectory_staleness_worst"):
        assert m[f"training/off_policy/{key}/min"] == m[f"training/off_policy/{key}/max"] == 0, m
    assert m["training/off_policy/trajectory_spans/max"] == 1, m
    # rollout correction: token-level IS weights on every response token, none outside the threshold
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == m["rollout_corr/rollout_is_ratio_fraction_low"] == 0, m
    assert abs(m["rollout_corr/kl"]) < 1e-4 and abs(m["rollout_corr/log_ppl_diff"]) < 1e-4, m
    # the weight sync after this step (verl naive sync into arl_hf), checked by arl's canary
    assert m["arl_sync/weight_version"] == step, m
    assert m["arl_sync/canary_max_abs"] < 1e-2 and m["arl_sync/canary_mean_abs"] < 2e-3, m
    assert m["training/global_step"] == step, m


def check_syncs(log: str, steps: list[int]) -> None:
    """One sync per ``steps`` entry (the launch's initial sync, then one after each step), in order,
    each checked by the canary: the replica served exactly the pushed weights."""
    logged = syncs(log)
    assert [s[0] for s in logged] == steps, logged
    assert [s[1] for s in logged] == list(range(1, len(steps) + 1)), logged  # the engine's own version counter
    assert all(gap_max < 1e-2 and gap_mean < 2e-3 for _, _, gap_max, gap_mean in logged), logged


def test_three_steps_then_a_checkpoint(fit):
    out, first, _ = fit
    steps = step_metrics(first)
    assert sorted(steps) == [1, 2, 3]
    for step, metrics in steps.items():
        check_step(step, metrics)
    assert "Training from scratch" in first
    check_syncs(first, [0, 1, 2, 3])
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
    # the replica starts from the checkpoint's weights (version 3), then gets step 4's
    check_syncs(resumed, [3, 4])


def test_resume_draws_the_data_an_uninterrupted_run_draws(fit):
    """Same data order: steps 1-3 drew verl's seeded order, and the resumed launch's step 4 draws what
    that order holds at step 4 (a dataloader not restored from the checkpoint would start over)."""
    out, _, _ = fit
    expected = uninterrupted_seeds(4)
    assert len({tuple(b) for b in expected}) == 4  # step 4 differs from steps 1-3: a restart would show
    assert [drawn_seeds(out, step) for step in (1, 2, 3)] == expected[:3]
    assert drawn_seeds(out, 4) == expected[3]


def test_the_gpu_checks_stage_check_reads_verls_real_console_lines(fit):
    """scripts/gpu_check_verl.py (the GPU check's verl row) on this fit's step 1: verl's real metric
    names, so every stage passes but the one a CPU run cannot (no CUDA memory)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_verl", REPO / "scripts" / "gpu_check_verl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _, first, _ = fit
    result = module.check(first)
    assert [name for name, stage in result["stages"].items() if not stage["ok"]] == ["on the GPU"], result["stages"]
    assert {"gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights"} <= set(result["seconds"])
