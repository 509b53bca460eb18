"""The GPU check's verl row, read back: one step of the 8-GPU launch on one GPU, stage by stage.

    python scripts/gpu_check_verl.py gpu-check/verl/launch.log --out gpu-check/verl/verl_step.json

scripts/gpu_check_verl.sh runs it on the launch's log. It reads verl's console metrics
(`arl.integrations.verl.console.step_metrics`, as tests/integrations/verl/test_verl_fit.py does on
the CPU) and checks every stage of step 1, printing one line per stage and the stage seconds
(verl's ``timing_s/*``); the JSON holds the checks, the seconds and every metric. Exit status 0 only
when every check passed.

The bounds are the CPU fit's where they carry over, loose where the GPU path differs: vLLM samples
in bf16 against verl's FSDP actor, so the rollout-vs-actor gap is reported, and only the correlation
of their token probabilities is bounded (a replica serving other weights than the actor's shows up
there); the actor and the reference hold the same weights at step 1, so the KL loss is ~0.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from arl.integrations.verl.console import step_metrics  # noqa: E402


def _finite(m: dict[str, float], key: str) -> bool:
    return key in m and math.isfinite(m[key])


# (stage, what is checked, check on step 1's metrics)
CHECKS = [
    ("rollout", "episodes in ArlAgentLoop on verl's vLLM server: response tokens, >= 1 turn each",
     lambda m: m.get("response_length/mean", 0) > 0 and m.get("num_turns/mean", 0) >= 2 and "timing_s/gen" in m),
    ("old log-probs", "the actor's log-probs of the rollout's tokens; rollout-vs-actor correlation > 0.9",
     lambda m: _finite(m, "training/rollout_probs_diff_max")
     and m.get("training/rollout_actor_probs_pearson_corr", 0) > 0.9 and "timing_s/old_log_prob" in m),
    ("reference", "reference log-probs and the KL loss (actor = reference at step 1: |KL| < 1e-3)",
     lambda m: _finite(m, "actor/kl_loss") and abs(m["actor/kl_loss"]) < 1e-3 and "timing_s/ref" in m),
    ("GiGPO", "arl_gigpo advantages (trainer mode arl_sync): anchor groups formed",
     lambda m: m.get("arl_gigpo/anchor_groups", 0) >= 1 and "timing_s/adv" in m),
    ("update", "update_actor: finite losses, entropy > 0, gradient norm > 0",
     lambda m: all(_finite(m, k) for k in ("actor/pg_loss", "actor/loss", "actor/entropy", "actor/grad_norm"))
     and m["actor/entropy"] > 0 and m["actor/grad_norm"] > 0 and "timing_s/update_actor" in m),
    ("on the GPU", "the actor allocated CUDA memory (0.0 on the CPU fit)",
     lambda m: m.get("actor/perf/max_memory_allocated_gb", 0) > 0),
    ("weight sync", "the update's weights pushed into vLLM after the step",
     lambda m: "timing_s/update_weights" in m),
    ("step", "verl counted step 1", lambda m: m.get("training/global_step") == 1),
]


def check(log: str) -> dict:
    """The checks of step 1 in ``log`` (verl's console output) as a JSON-able dict: ``ok``, one entry
    per stage, verl's stage seconds and step 1's metrics.

    >>> check("(TaskRunner pid=1) step:1 - training/global_step:1")["stages"]["step"]["ok"]
    True
    >>> check("no console lines")["ok"], check("no console lines")["error"]
    (False, 'no step:1 line in the log (verl printed no console metrics for step 1)')
    """
    steps = step_metrics(log)
    if 1 not in steps:
        return {"ok": False, "error": "no step:1 line in the log (verl printed no console metrics for step 1)",
                "stages": {}, "seconds": {}, "metrics": {}}
    m = steps[1]
    stages = {name: {"ok": bool(ok(m)), "what": what} for name, what, ok in CHECKS}
    seconds = {k.removeprefix("timing_s/"): v for k, v in m.items() if k.startswith("timing_s/")}
    return {"ok": all(s["ok"] for s in stages.values()), "stages": stages, "seconds": seconds, "metrics": m}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = check(args.log.read_text(errors="replace") if args.log.is_file() else "")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    if "error" in result:
        print(f"verl row: {result['error']}")
        return 1
    for name, stage in result["stages"].items():
        print(f"  {'ok  ' if stage['ok'] else 'FAIL'} {name:14} {stage['what']}")
    m = result["metrics"]
    for key in ("training/rollout_probs_diff_max", "training/rollout_actor_probs_pearson_corr", "actor/kl_loss",
                "actor/grad_norm", "actor/perf/max_memory_allocated_gb", "response_length/mean", "num_turns/mean"):
        if key in m:
            print(f"  {key} = {m[key]:.4g}")
    print("  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(result["seconds"].items())))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
