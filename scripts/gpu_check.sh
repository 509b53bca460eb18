#!/usr/bin/env bash
# The GPU check (issue 14 item 7), one prepared script for a machine with an NVIDIA GPU:
#   bash scripts/gpu_check.sh [OUT_DIR]        (default OUT_DIR: gpu-check/; ~10-15 min on one GPU, the verl row not counted)
#
# 1. installs arl with the `gpu` extra (stock vllm with its CUDA torch) into .venv-gpu,
# 2. runs the engine contract suite on CUDA (float32: greedy tokens and log-probs of vllm,
#    vllm-async and hf agree; weight push == trainer log-probs; bfloat16: test_bf16.py, within bf16's
#    tolerance; sleep mode: test_sleep_mode.py on real sleep-mode engines) and the trainer tests,
# 3. times SmolLM2-135M FrozenLake training steps (benchmarks/trainer_step.py) at the demo's
#    geometry (8 groups x 8) and at RAGEN's (8 groups x 16, <= 5 turns), synchronous and
#    overlapped (rollout.max_staleness=1: on a GPU the update's kernels release the GIL, which on
#    CPU made overlap useless; benchmarks/README "Overlapped training"), and synchronous with the
#    engine asleep through every update (engine.sleep_mode=true: what the round trip costs),
# 4. LoRA: a SmolLM2-135M rank-16 step, and the weight push full vs adapter (benchmarks/weight_push.py),
# 5. a slice of a reproduction preset: Qwen2.5-0.5B-Instruct in RAGEN's Sokoban harness
#    (configs/qwen05b_sokoban_ragen.yaml: 3 steps of 2 groups x 16 episodes, <= 5 turns, evaluation only
#    after the last step, on 32 levels). The model comes from the hub, or from a local copy:
#    ARL_QWEN05B=/path/to/Qwen2.5-0.5B-Instruct bash scripts/gpu_check.sh.
# 6. verl (issue 45): one step of docs/verl.md's 8-GPU launch on this one GPU, SmolLM2-135M built
#    locally, vLLM rollout, each stage checked in verl's metrics (scripts/gpu_check_verl.sh, its own
#    venv .venv-gpu-verl; files in OUT_DIR/verl/). A failure there is reported, and the check's
#    exit status says so; it runs last, so the rows above never wait on it. ARL_GPU_CHECK_VERL=0 skips it.
# Everything it prints is also written to OUT_DIR (log, result JSONs) for the closing note.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1

command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "no NVIDIA GPU (nvidia-smi -L failed)"; exit 2; }
export VENV=.venv-gpu ARL_DEVICE=gpu
start=$(date +%s)
bash scripts/install.sh
PY=$VENV/bin/python
echo "install: $(( $(date +%s) - start )) s"

echo "== engine contract suite and trainer tests on CUDA"
$PY -m pytest -q -p no:cacheprovider tests/engine tests/train -m "not slow" 2>&1 | tail -25

CONFIG=configs/smollm2_frozenlake_gigpo.yaml
COMMON=(engine.gpu_memory_utilization=0.5 engine.kv_cache_memory_bytes=null optim.micro_batch_size=32)
for mode in 0 1; do
  echo "== SmolLM2-135M step, demo geometry (8 x 8), max_staleness=$mode"
  $PY benchmarks/trainer_step.py --config $CONFIG --steps 6 --out "$OUT/step_8x8_stale$mode.json" \
    "${COMMON[@]}" rollout.num_groups=8 rollout.group_size=8 rollout.max_staleness=$mode | tail -12
  echo "== SmolLM2-135M step, RAGEN geometry (8 x 16, <= 5 turns), max_staleness=$mode"
  $PY benchmarks/trainer_step.py --config $CONFIG --steps 6 --out "$OUT/step_8x16_stale$mode.json" \
    "${COMMON[@]}" rollout.num_groups=8 rollout.group_size=16 rollout.manager.max_turns=5 \
    rollout.max_staleness=$mode | tail -12
done
echo "== SmolLM2-135M step, demo geometry (8 x 8), the engine asleep through every update"
$PY benchmarks/trainer_step.py --config $CONFIG --steps 6 --out "$OUT/step_8x8_sleep.json" \
  "${COMMON[@]}" rollout.num_groups=8 rollout.group_size=8 engine.sleep_mode=true | tail -12
echo "== LoRA (issue 17): SmolLM2-135M rank-16 step at the demo geometry, and the push, full vs adapter"
$PY benchmarks/trainer_step.py --config configs/smollm2_frozenlake_gigpo_lora.yaml --steps 6 \
  --out "$OUT/step_8x8_lora.json" "${COMMON[@]}" rollout.num_groups=8 rollout.group_size=8 | tail -12
$PY benchmarks/weight_push.py --backends vllm vllm-async --out "$OUT/weight_push.json" | tail -8
echo "== Qwen2.5-0.5B-Instruct, a slice of configs/qwen05b_sokoban_ragen.yaml (RAGEN's harness): 3 steps, 2 x 16"
$PY benchmarks/trainer_step.py --config configs/qwen05b_sokoban_ragen.yaml --steps 3 \
  --out "$OUT/step_qwen05b_sokoban_ragen_slice.json" rollout.num_groups=2 eval.every=0 eval.num_seeds=32 \
  ${ARL_QWEN05B:+model=$ARL_QWEN05B} | tail -12
verl_rc=0
if [ "${ARL_GPU_CHECK_VERL:-1}" = 1 ]; then
  echo "== verl: one step of the 8-GPU launch on 1 GPU (scripts/gpu_check_verl.sh)"
  bash scripts/gpu_check_verl.sh "$OUT" || { verl_rc=$?; echo "verl row FAILED (rc=$verl_rc): $OUT/verl/"; }
fi
echo "gpu check done in $(( $(date +%s) - start )) s; results in $OUT/"
exit $verl_rc
