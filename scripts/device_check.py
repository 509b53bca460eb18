"""The offline device check's driver (run by scripts/device_check.sh after it installed arl).

    python scripts/device_check.py --out device-check            # every phase, time-boxed
    ARL_DEVICE_CHECK_CPU=1 python scripts/device_check.py --out /tmp/dc   # the CPU rehearsal

Phases, each one a subprocess in its own process group with a timeout (a hang is killed and
recorded, and the next phase runs), inside one overall budget (ARL_DEVICE_CHECK_BUDGET_S):

- ``versions``: Python, torch, CUDA, the GPU, transformers/peft/accelerate, whether vllm imports;
- ``model``: the tiny model built on the spot (`arl.models`, a fresh ARL_HOME), with vLLM absent;
- ``pytest-engine``: the engine contract suite that applies without vLLM (`-m "not vllm"`: the hf
  and scripted backends, bf16, LoRA on hf), on CUDA when there is one;
- ``train-fp32`` / ``train-bf16`` / ``train-lora``: a few timed `Trainer.step()` calls of the demo's
  config on the ``hf`` engine (fp32; ``optim.precision=bf16 engine.dtype=bfloat16``; the LoRA twin);
  ``train-visual``: one step of the qwen25vl3b_sokoban_gigpo_visual preset with ``model=tiny-vl``
  (image observations, its canary's image probe included):
  setup, step, rollout, update, weight-push and evaluation seconds, the engine-trainer log-prob gap
  and importance weight, peak CUDA memory;
- ``pytest-train``: the trainer tests that run without vLLM.

Written to OUT: results.json (everything), results.md (the tables), logs/<phase>.log, and
phases/<phase>.json (what a phase measured). Exit status 0 only when every phase passed.

ARL_DEVICE_CHECK_CPU=1: the CPU rehearsal: CUDA hidden, vLLM hidden from every phase (a stub
``vllm`` module that fails to import, first on PYTHONPATH: the device has no vLLM), fewer steps
and episodes, a smaller test selection. ARL_DEVICE_CHECK_HIDE_VLLM=0/1 overrides the stub.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CPU = os.environ.get("ARL_DEVICE_CHECK_CPU", "0") == "1"
HIDE_VLLM = os.environ.get("ARL_DEVICE_CHECK_HIDE_VLLM", "1" if CPU else "0") == "1"

# (phase, timeout s on a GPU, timeout s on the CPU)
PHASES = [
    ("versions", 60, 120),
    ("model", 90, 300),
    ("pytest-engine", 150, 600),
    ("train-fp32", 75, 300),
    ("train-bf16", 75, 300),
    ("train-lora", 75, 300),
    ("train-visual", 120, 600),
    ("pytest-train", 180, 600),
]
# pytest selections: (paths, marker expression, -k expression or None)
PYTEST = {
    "pytest-engine": (["tests/engine"], "not vllm", None),
    "pytest-train": (["tests/train"], "not vllm", None),
}
PYTEST_CPU = {  # the rehearsal checks the mechanics, not the suite (2 shared cores)
    "pytest-engine": (["tests/engine/test_contract.py", "tests/engine/test_bf16.py"], "not vllm", None),
    "pytest-train": (["tests/train/test_trainer.py"], "not vllm and not slow",
                     "every_parameter or micro_batches or shipped_config or nan_update"),
}
# train variants: (config, overrides)
VARIANTS = {
    "fp32": ("tiny_frozenlake_gigpo", []),
    "bf16": ("tiny_frozenlake_gigpo", ["optim.precision=bf16", "engine.dtype=bfloat16"]),
    "lora": ("tiny_frozenlake_gigpo_lora", []),
    # GiGPO's visual Sokoban preset (image observations, GiGPO, KL, 15 actions) at tiny-vl's size, one step:
    # Qwen2.5-VL-3B's weights are a hub download the offline device cannot make; replies cut to 32 tokens.
    "visual": ("qwen25vl3b_sokoban_gigpo_visual", ["model=tiny-vl", "steps=1", "rollout.manager.max_tokens=32"]),
}
GEOMETRY = {  # steps, groups, episodes per group, validation levels
    "gpu": (6, 8, 8, 64),
    "cpu": (2, 2, 4, 8),
}
STEP_KEYS = ("rollout", "advantages", "update", "weight_push", "canary")  # timing/<key>_s, where logged
WATCH = ("train/logprob_gap", "train/is_weight_mean", "train/ratio_max", "train/clip_frac", "train/kl",
         "train/weight_push_bytes", "train/num_samples", "train/num_response_tokens", "rollout/success_rate",
         "rollout/valid_action_rate", "eval/success_rate", "eval/valid_action_rate")


# -- phases (run in a child process: `device_check.py --phase NAME`) ------------------------------


def phase_versions(out: Path) -> dict:
    info: dict = {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform()}
    import torch

    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
                cudnn=torch.backends.cudnn.version() if torch.cuda.is_available() else None)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                    gpu_capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                    gpu_memory_gib=round(props.total_memory / 2**30, 1), bf16_supported=torch.cuda.is_bf16_supported())
    for name in ("transformers", "peft", "accelerate", "numpy", "gymnasium", "openai", "cattrs", "attrs",
                 "aiohttp", "pytest", "tokenizers", "safetensors"):
        try:
            info[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 -- a missing package is a finding, not a crash
            info[name] = f"missing ({type(exc).__name__})"
    try:
        import vllm  # noqa: F401

        info["vllm"] = getattr(sys.modules["vllm"], "__version__", "importable")
    except ImportError as exc:
        info["vllm"] = f"absent ({exc})"[:120]
    import arl

    info["arl"] = str(Path(arl.__file__).parent)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["nvidia_smi"] = f"unavailable ({type(exc).__name__})"
    for k, v in info.items():
        print(f"{k}: {v}")
    return info


def phase_model(out: Path) -> dict:
    t0 = time.perf_counter()
    from arl.models import resolve_model

    path = resolve_model("tiny")
    built_s = time.perf_counter() - t0
    from transformers import AutoModelForCausalLM

    import arl.engine.hf  # noqa: F401 -- the hf engine and the trainer must not need vLLM
    import arl.train  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(path)
    info = {"path": path, "build_s": round(built_s, 2), "params": sum(p.numel() for p in model.parameters()),
            "vllm_imported": "vllm" in sys.modules and sys.modules["vllm"] is not None}
    print(json.dumps(info))
    if info["vllm_imported"]:
        raise SystemExit("building the model or importing the hf engine / trainer imported vllm")
    return info


def _extra(key: str) -> bool:
    """A weight-sync canary or engine-trainer mismatch metric (not its timing)."""
    return ("canary" in key or "mismatch" in key) and "/" in key and not key.startswith("timing/")


async def _train(variant: str, out: Path) -> dict:
    import torch

    from arl.config import load_config
    from arl.train import Trainer

    steps, groups, size, levels = GEOMETRY["cpu" if CPU else "gpu"]
    config_name, extra = VARIANTS[variant]
    run_root = tempfile.mkdtemp(prefix=f"arl-device-check-{variant}-")
    overrides = ["engine.backend=hf", "sft.steps=0", "eval.at_start=false", "eval.every=0",
                 f"eval.num_seeds={levels}", f"steps={steps}", f"rollout.num_groups={groups}",
                 f"rollout.group_size={size}", "tensorboard=false", "keep_checkpoints=1", "save_every=0",
                 f"out_dir={run_root}", f"name=device-check-{variant}", *extra]
    config = load_config(config_name, overrides)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rows = []
    async with Trainer(config) as trainer:
        t0 = time.perf_counter()
        await trainer.setup()
        setup_s = time.perf_counter() - t0
        devices = {"trainer": str(trainer.device), "engine": str(getattr(trainer.engine, "device", "?")),
                   "trainer_dtype": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
                   "engine_dtype": str(next(trainer.engine.model.parameters()).dtype).removeprefix("torch.")}
        print(f"setup {setup_s:.2f} s; {devices}", flush=True)
        for i in range(config.steps):  # a variant may set its own (visual: one)
            m = await trainer.step()
            parts = {k: m[f"timing/{k}_s"] for k in STEP_KEYS if f"timing/{k}_s" in m}
            eval_s = m["timing/step_s"] - sum(parts.values()) if "eval/success_rate" in m else 0.0
            row = {"step": i + 1, **{f"{k}_s": v for k, v in parts.items()}, "eval_s": eval_s,
                   "step_s": m["timing/step_s"] - eval_s,
                   **{k: m[k] for k in WATCH if k in m},
                   **{k: v for k, v in m.items() if _extra(k)}}
            rows.append(row)
            print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    shutil.rmtree(run_root, ignore_errors=True)  # its checkpoint is of no use
    measured = rows[1:] or rows  # the first step is a warm-up (first backward, allocator growth)

    def med(key: str) -> float | None:
        vals = [r[key] for r in measured if key in r]
        return statistics.median(vals) if vals else None

    summary = {"variant": variant, "config": config_name, "overrides": overrides, "devices": devices,
               "geometry": {"steps": config.steps, "num_groups": groups, "group_size": size, "eval_levels": levels},
               "setup_s": setup_s, "median_over_steps": [r["step"] for r in measured],
               **{f"{k}_s": med(f"{k}_s") for k in (*STEP_KEYS, "step")},
               "eval_s": rows[-1]["eval_s"], "logprob_gap": med("train/logprob_gap"),
               "is_weight_mean": med("train/is_weight_mean"), "eval_success_rate": rows[-1].get("eval/success_rate"),
               "extra_metrics": {k: med(k) for k in sorted({k for r in rows for k in r if _extra(k)})},
               "steps": rows}
    if cuda:
        summary["peak_cuda_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        summary["peak_cuda_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    return summary


def run_phase_in_child(name: str, out: Path) -> int:
    """The body of one phase, in this (child) process; its result goes to OUT/phases/NAME.json."""
    if name == "versions":
        result = phase_versions(out)
    elif name == "model":
        result = phase_model(out)
    elif name.startswith("train-"):
        result = asyncio.run(_train(name.removeprefix("train-"), out))
    else:
        raise SystemExit(f"unknown phase {name!r}")
    (out / "phases").mkdir(parents=True, exist_ok=True)
    (out / "phases" / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


# -- the driver -------------------------------------------------------------------------------------


def child_env(arl_home: Path, shim: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ARL_HOME=str(arl_home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", PIP_NO_INDEX="1")
    if CPU:
        env["CUDA_VISIBLE_DEVICES"] = ""
    if shim is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    return env


def vllm_shim() -> Path:
    """A directory whose `vllm` module fails to import: vLLM as absent as on the device."""
    d = Path(tempfile.mkdtemp(prefix="arl-no-vllm-"))
    (d / "vllm.py").write_text('raise ModuleNotFoundError("vllm is hidden by the device check (no vLLM on the device)", '
                               'name="vllm")\n')
    return d


def pytest_command(name: str, out: Path) -> list[str]:
    paths, marks, keyword = (PYTEST_CPU if CPU else PYTEST)[name]
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", marks,
           f"--junitxml={out / 'logs' / (name + '.xml')}", "--timeout", "600" if CPU else "120", *paths]
    return cmd + (["-k", keyword] if keyword else [])


def log_summary(log: Path) -> dict:
    """Counts from pytest's -v lines: what a run killed at its timeout (no junit file) got through."""
    statuses: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)
        if m:
            statuses[m.group(1)] = m.group(2)
    values = list(statuses.values())
    bad = [t for t, st in statuses.items() if st in ("FAILED", "ERROR")]
    return {"tests": len(values), "passed": values.count("PASSED") + values.count("XPASS"),
            "failures": values.count("FAILED"), "errors": values.count("ERROR"),
            "skipped": values.count("SKIPPED") + values.count("XFAIL"), "failed_tests": bad[:20],
            "partial": True, "last_test": next(reversed(statuses), None)}


def junit_summary(path: Path) -> dict:
    if not path.exists():
        return {}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return {}
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    bad = [f"{case.get('classname', '')}::{case.get('name')}" for case in suite.iter("testcase")
           if case.find("failure") is not None or case.find("error") is not None]
    counts["failed_tests"] = bad[:20]
    return counts


def run_phase(name: str, timeout: float, out: Path, env: dict[str, str]) -> dict:
    log = out / "logs" / f"{name}.log"
    cmd = (pytest_command(name, out) if name.startswith("pytest-")
           else [sys.executable, str(Path(__file__).resolve()), "--phase", name, "--out", str(out)])
    t0 = time.perf_counter()
    with log.open("w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        status = None
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = f"timeout ({timeout:.0f} s)"
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = proc.returncode
    seconds = time.perf_counter() - t0
    result = {"name": name, "rc": rc, "seconds": round(seconds, 1), "timeout_s": round(timeout),
              "log": str(log.relative_to(out))}
    if name.startswith("pytest-"):
        result["pytest"] = junit_summary(out / "logs" / f"{name}.xml") or log_summary(log)
        # rc 5: nothing selected; a selection that runs nothing checks nothing
        result["status"] = status or ("pass" if rc == 0 else f"fail (rc {rc})")
    else:
        data = out / "phases" / f"{name}.json"
        if data.exists():
            result["data"] = json.loads(data.read_text())
        result["status"] = status or ("pass" if rc == 0 and data.exists() else f"fail (rc {rc})")
    return result


def details(r: dict) -> str:
    if "pytest" in r and r["pytest"]:
        p = r["pytest"]
        text = f"{p['passed']} passed, {p['failures'] + p['errors']} failed, {p['skipped']} skipped"
        if p.get("partial"):
            text += f" before it was stopped (last: {str(p['last_test']).split('::')[-1]})"
        if p["failed_tests"]:
            text += "; failed: " + ", ".join(t.split("::")[-1] for t in p["failed_tests"][:5])
        return text
    d = r.get("data") or {}
    if r["name"] == "versions" and d:
        gpu = f"{d.get('gpu')} ({d.get('gpu_memory_gib')} GiB, sm {d.get('gpu_capability')})" if d.get("cuda_available") \
            else "no CUDA"
        return (f"Python {d.get('python')}, torch {d.get('torch')} (CUDA {d.get('torch_cuda')}), {gpu}, "
                f"transformers {d.get('transformers')}, peft {d.get('peft')}, vllm: {str(d.get('vllm'))[:40]}")
    if r["name"] == "model" and d:
        return f"tiny built in {d['build_s']} s, {d['params']:,} params, vllm imported: {d['vllm_imported']}"
    if r["name"].startswith("train-") and d:
        return (f"{d['devices']['trainer']} / engine {d['devices']['engine']} ({d['devices']['engine_dtype']}), "
                f"step {fmt(d.get('step_s'))} s")
    if r["name"] == "install":
        return f"pip --no-index from the wheels (rc {r['rc']})"
    return ""


def canary(extra: dict) -> str:
    return ", ".join(f"{k.split('/')[-1]} {fmt(v, 6)}" for k, v in extra.items()) or "-"


def fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}" if abs(x) < 1000 else f"{x:,.0f}"


def write_results(out: Path, results: dict) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    lines = [f"# arl device check, {results['started']} ({results['mode']})", "",
             f"Host: {results['host']}; total {results.get('total_s', '-')} s of a {results['budget_s']} s budget.", "",
             "| phase | status | seconds | details |", "|---|---|---|---|"]
    for r in results["phases"]:
        lines.append(f"| {r['name']} | {r['status']} | {r.get('seconds', '-')} | {details(r)} |")
    trains = [r for r in results["phases"] if r["name"].startswith("train-") and r.get("data")]
    if trains:
        g = trains[0]["data"]["geometry"]
        lines += ["", f"Timed training steps: the `hf` engine, the tiny model, {g['num_groups']} groups x "
                  f"{g['group_size']} episodes, {g['steps']} steps (medians over steps "
                  f"{trains[0]['data']['median_over_steps'][0]}-{g['steps']}; the first is a warm-up), evaluation on "
                  f"{g['eval_levels']} levels after the last step. Seconds.", "",
                  "| variant | trainer / engine | setup | step | rollout | update | push | eval | log-prob gap "
                  "| IS weight | canary / mismatch | eval success | peak CUDA MiB (alloc / reserved) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in trains:
            d = r["data"]
            dev = d["devices"]
            peak = (f"{d['peak_cuda_allocated_mib']:,.0f} / {d['peak_cuda_reserved_mib']:,.0f}"
                    if "peak_cuda_allocated_mib" in d else "- (no CUDA)")
            lines.append(
                f"| {d['variant']} | {dev['trainer']} {dev['trainer_dtype']} / {dev['engine']} {dev['engine_dtype']} "
                f"| {fmt(d['setup_s'], 2)} | {fmt(d['step_s'])} | {fmt(d['rollout_s'])} | {fmt(d['update_s'])} "
                f"| {fmt(d['weight_push_s'])} | {fmt(d['eval_s'])} | {fmt(d['logprob_gap'], 6)} "
                f"| {fmt(d['is_weight_mean'], 4)} | {canary(d['extra_metrics'])} | {fmt(d['eval_success_rate'])} "
                f"| {peak} |")
        extra = sorted({k for r in trains for k in r["data"]["extra_metrics"]})
        lines += ["", "Log-prob gap: mean |trainer - engine| log-prob of the sampled tokens (train/logprob_gap). "
                  "Canary / mismatch metrics logged: " + (", ".join(extra) if extra else "none in this version")
                  + " (medians; per step: results.json)."]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "device-check"))
    ap.add_argument("--install", help="install.json written by device_check.sh")
    ap.add_argument("--phase", help=argparse.SUPPRESS)  # internal: run one phase in this process
    args = ap.parse_args()
    out = Path(args.out).resolve()
    if args.phase:
        return run_phase_in_child(args.phase, out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    budget = float(os.environ.get("ARL_DEVICE_CHECK_BUDGET_S", 1500 if CPU else 360))
    start = time.perf_counter()
    results: dict = {"mode": "CPU rehearsal (ARL_DEVICE_CHECK_CPU=1)" if CPU else "device",
                     "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "budget_s": budget,
                     "host": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
                             f"{platform.python_version()}",
                     "vllm_hidden": HIDE_VLLM, "phases": []}
    if args.install:
        inst = json.loads(Path(args.install).read_text())
        results["phases"].append({"name": "install", "rc": inst["rc"], "seconds": inst["seconds"], "log": inst["log"],
                                  "status": "pass" if inst["rc"] == 0 else f"fail (rc {inst['rc']})"})
    build = REPO / "build"
    build.mkdir(exist_ok=True)
    arl_home = Path(tempfile.mkdtemp(prefix="device-check-home-", dir=build))  # the tiny model, built on the spot
    shim = vllm_shim() if HIDE_VLLM else None
    env = child_env(arl_home, shim)
    write_results(out, results)
    for name, gpu_timeout, cpu_timeout in PHASES:
        left = budget - (time.perf_counter() - start)
        if left < 20:
            r = {"name": name, "status": "skipped (budget spent)", "seconds": 0}
        else:
            r = run_phase(name, min(cpu_timeout if CPU else gpu_timeout, left), out, env)
        results["phases"].append(r)
        print(f"== {name}: {r['status']} ({r.get('seconds', 0)} s) {details(r)}", flush=True)
        if r["status"] != "pass" and "log" in r:
            tail = (out / r["log"]).read_text(errors="replace").splitlines()[-15:]
            print("   " + "\n   ".join(tail), flush=True)
        results["total_s"] = round(time.perf_counter() - start, 1)
        write_results(out, results)
    print((out / "results.md").read_text())
    for tmp in (arl_home, shim):  # the model built on the spot, the vLLM stub
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(r["status"] == "pass" for r in results["phases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
