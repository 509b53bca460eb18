"""The GPU check's verl row (scripts/gpu_check_verl.sh) as far as a CPU machine can check it: the
scripts parse, the row launches exactly the 8-GPU launch (sokoban_gigpo.sh) plus the overrides
docs/verl.md "The one-GPU check" lists, that config passes verl's `validate_config` at 1 GPU, and
the stage check (scripts/gpu_check_verl.py) tells a GPU step from a CPU one and from one without an
update. ``python`` is a recorder throughout: nothing is installed or launched."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
ROW = REPO / "scripts" / "gpu_check_verl.sh"
MODEL = "/models/SmolLM2-135M-Instruct"  # the row's MODEL (a path: the recorder builds nothing)


def test_scripts_parse():
    for script in ("gpu_check.sh", "gpu_check_verl.sh"):
        out = subprocess.run(["bash", "-n", str(REPO / "scripts" / script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


def test_gpu_check_runs_the_verl_row_last_and_reports_its_failure():
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    call = 'bash scripts/gpu_check_verl.sh "$OUT" || { verl_rc=$?;'
    assert call in script
    tail = script[script.index(call):]
    assert "benchmarks/" not in tail  # nothing of the check waits on it
    assert tail.rstrip().endswith("exit $verl_rc")


def run_row(tmp_path: Path, **env: str) -> tuple[list[list[str]], str]:
    """The commands the row runs with its venv's ``python`` a recorder (and a fake ``nvidia-smi``), and
    the row's output."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    log = tmp_path / "argv.log"
    log.unlink(missing_ok=True)
    fake = venv / "bin" / "python"
    fake.write_text('#!/bin/sh\nprintf "%s\\037" "$@" >> "$ARGV_LOG"; printf "\\036" >> "$ARGV_LOG"\n')
    fake.chmod(0o755)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir(exist_ok=True)
    smi.write_text('#!/bin/sh\necho "GPU 0: a recorder"\n')
    smi.chmod(0o755)
    out = subprocess.run(
        ["bash", str(ROW), str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": f"{smi.parent}:{os.environ['PATH']}", "ARGV_LOG": str(log),
             "ARL_VERL_VENV": str(venv), "MODEL": MODEL, **env})
    assert out.returncode == 0, out.stdout + out.stderr
    calls = [[a for a in call.split("\x1f") if a] for call in log.read_text().split("\x1e") if call]
    return calls, out.stdout


def _one_gpu_section() -> str:
    text = (REPO / "docs" / "verl.md").read_text()
    section = text[text.index("## The one-GPU check"):]
    return section[: section.index("\n## ", 1)]


def _one_gpu_env() -> dict[str, str]:
    """The environment docs/verl.md says the row gives sokoban_gigpo.sh (besides MODEL and DATA)."""
    shown = re.search(r"`(N_GPUS=[^`]*)`", _one_gpu_section())
    assert shown, "no `N_GPUS=...` under '## The one-GPU check'"
    return dict(item.split("=", 1) for item in shown.group(1).split())


def _one_gpu_table() -> dict[str, list[str]]:
    """The overrides docs/verl.md's "The one-GPU check" table lists, by row name."""
    section = _one_gpu_section()
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]
    assert rows, "no table under '## The one-GPU check'"
    return {row.split(" | ")[0].lstrip("| "): re.findall(r"`([^`=]+=[^`]*)`", row.split(" | ")[1]) for row in rows}


@pytest.mark.parametrize("flash_attn", ["1", "0"])
def test_row_launches_the_8_gpu_launch_plus_the_documented_overrides(tmp_path, flash_attn):
    from conftest import compose_verl, example_overrides
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    calls, _ = run_row(tmp_path, FLASH_ATTN=flash_attn)
    out = tmp_path / "out" / "verl"
    mains = [c for c in calls if c[:2] == ["-m", "verl.trainer.main_ppo"]]
    assert len(mains) == 1
    row = mains[0][2:]
    # the 8-GPU launch with the row's environment, then the table (the flash_attn row only without it)
    (tmp_path / "gpu").mkdir()
    gpu = example_overrides(tmp_path / "gpu", MODEL=MODEL, DATA=str(out / "data"), **_one_gpu_env())
    table = _one_gpu_table()
    appended = [o.replace("$OUT", str(out)) for name, items in table.items()
                for o in items if flash_attn == "0" or not name.startswith("only without")]
    assert row == gpu + appended
    assert "trainer.n_gpus_per_node=1" in row and "actor_rollout_ref.rollout.name=vllm" in row
    assert f"actor_rollout_ref.model.path={MODEL}" in row and "trainer.total_training_steps=1" in row
    # what verl.trainer.main_ppo runs before Ray starts (hydra.* is hydra's own, not verl's config)
    config = compose_verl([o for o in row if not o.startswith("hydra.")])
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert config.trainer.val_before_train is False and config.trainer.save_freq == -1
    # verl makes world_size // (tp * dp * pp) vLLM replicas (workers/rollout/llm_server.py), which
    # validate_config does not check (verl's default tensor parallel 2 would leave none on 1 GPU)
    rollout = config.actor_rollout_ref.rollout
    replica = rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
    assert gpus // replica == 1 and gpus % replica == 0, (gpus, replica)
    # the datasets it writes are the ones it trains on, and then the stage check reads the launch's log
    outs = [c[c.index("--out") + 1] for c in calls if c[:2] == ["-m", "arl.integrations.verl.dataset"]]
    assert outs == [str(out / "data" / "train.parquet"), str(out / "data" / "val.parquet")]
    assert calls[-1] == ["scripts/gpu_check_verl.py", str(out / "launch.log"), "--out", str(out / "verl_step.json")]


def test_row_installs_what_docs_tell_a_user(tmp_path):
    """The row's install is docs/verl.md's line, with the smollm extra that builds its model."""
    calls, _ = run_row(tmp_path, FLASH_ATTN="0")
    text = (REPO / "docs" / "verl.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("pip install -e '.[verl]'"))
    docs = shlex.split(line.split("#")[0])[2:]  # after `pip install`
    installs = [c[3:] for c in calls if c[:3] == ["-m", "pip", "install"] and "-e" in c]
    assert len(installs) == 1
    row = [a for a in installs[0] if not a.startswith(("-q", "--disable"))]
    assert row == [a.replace(".[verl]", ".[verl,smollm]") for a in docs]


def test_row_probes_flash_attn_when_not_told(tmp_path):
    calls, out = run_row(tmp_path)  # FLASH_ATTN unset: auto (the recorder "imports" flash_attn)
    assert ["-c", "import flash_attn"] in calls
    assert "flash-attention 2: 1" in out


# the stage check, on verl's console format (np.* scalars as verl prints them)
GPU_STEP = (
    "(TaskRunner pid=7) step:1 - actor/entropy:1.91 - training/rollout_probs_diff_max:0.31 - "
    "training/rollout_actor_probs_pearson_corr:0.987 - arl_gigpo/anchor_groups:4.0 - actor/pg_loss:0.02 - "
    "actor/kl_loss:0.0 - actor/loss:0.018 - actor/grad_norm:0.74 - actor/perf/max_memory_allocated_gb:3.2 - "
    "training/global_step:1 - response_length/mean:612.5 - num_turns/mean:np.float64(20.0) - "
    "timing_s/gen:14.2 - timing_s/old_log_prob:1.1 - timing_s/ref:0.9 - timing_s/adv:0.05 - "
    "timing_s/update_actor:2.3 - timing_s/update_weights:1.4 - timing_s/step:20.9"
)


def _check_module():
    spec = importlib.util.spec_from_file_location("gpu_check_verl", REPO / "scripts" / "gpu_check_verl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stage_check_passes_a_gpu_step_and_writes_its_seconds(tmp_path):
    module = _check_module()
    log = tmp_path / "launch.log"
    log.write_text("Ray started\n" + GPU_STEP + "\n")
    assert module.main([str(log), "--out", str(tmp_path / "step.json")]) == 0
    result = json.loads((tmp_path / "step.json").read_text())
    assert result["ok"] and all(s["ok"] for s in result["stages"].values())
    assert result["seconds"]["update_actor"] == 2.3 and result["metrics"]["num_turns/mean"] == 20.0


@pytest.mark.parametrize(("change", "stage"), [
    ("actor/perf/max_memory_allocated_gb:3.2", "on the GPU"),            # a CPU run: no CUDA memory
    ("actor/grad_norm:0.74", "update"),                                   # no update's metrics
    ("training/rollout_actor_probs_pearson_corr:0.987", "old log-probs"),  # vLLM served other weights
    ("actor/kl_loss:0.0", "reference"),
    ("timing_s/update_weights:1.4", "weight sync"),
])
def test_stage_check_names_the_stage_that_is_missing(change, stage):
    key, value = change.split(":")
    bad = {"actor/perf/max_memory_allocated_gb": "0.0", "actor/grad_norm": "nan",
           "training/rollout_actor_probs_pearson_corr": "0.12", "actor/kl_loss": "0.5"}.get(key)
    log = GPU_STEP.replace(change, f"{key}:{bad}") if bad else GPU_STEP.replace(f" - {change}", "")
    assert log != GPU_STEP
    result = _check_module().check(log)
    assert not result["ok"]
    assert [name for name, s in result["stages"].items() if not s["ok"]] == [stage]


def test_stage_check_fails_without_a_step(tmp_path):
    module = _check_module()
    log = tmp_path / "launch.log"
    log.write_text("ray.exceptions.RayTaskError: ...\n")
    assert module.main([str(log)]) == 1
    assert module.main([str(tmp_path / "missing.log")]) == 1
