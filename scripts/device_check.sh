#!/usr/bin/env bash
# The offline device check, one command for a GPU machine without a network and without vLLM:
#   bash scripts/device_check.sh          (figures in ${OUT:-device-check}/; the install, then a 6-minute budget)
# It needs .device-wheels/ beside the tree (made HERE, where there is a network, by
# `bash scripts/device_wheels.sh`; it travels to the device as an ignored folder).
#
# 1. an overlay venv (.venv-device) on the device's own Python: the interpreter's packages (CUDA
#    torch, transformers, peft, ...) stay visible through a .pth file, and arl installs on top of
#    them from the wheels only: `pip install --no-index --find-links .device-wheels
#    --no-build-isolation -e .` (no extras, so no vllm; --no-index, so no network), then pytest;
# 2. scripts/device_check.py: versions (torch, CUDA, GPU), the tiny model built on the spot, the
#    engine contract and trainer tests that run without vLLM (`-m "not vllm"`) on CUDA, and timed
#    hf-engine training steps on CUDA in fp32, bf16 and LoRA, and one step of the visual preset at
#    tiny-vl size (qwen25vl3b_sokoban_gigpo_visual, model=tiny-vl) (step / update / push seconds, the
#    engine-trainer log-prob gap, peak CUDA memory). Every phase is time-boxed and a failed one
#    is recorded and passed, so one hang cannot eat the budget.
# Results: OUT/results.json, OUT/results.md (the table), OUT/device_check.log, OUT/logs/*.
# Not in it: verl's loop (docs/verl.md "What ran where"): the `verl` extra needs at least 173 MiB of
# wheels beyond the device's image (ray alone 76 MiB) and vLLM; scripts/gpu_check.sh's verl row runs it
# where pip reaches PyPI.
#
# CPU rehearsal (this project's CPU machines): ARL_DEVICE_CHECK_CPU=1 runs the same phases on the
# CPU with fewer steps and a smaller test selection, vLLM hidden from every phase.
# Knobs: ARL_DEVICE_CHECK_PYTHON (the base interpreter, default python3), ARL_DEVICE_VENV
# (default .venv-device), DEVICE_WHEELS (default .device-wheels), ARL_DEVICE_CHECK_BUDGET_S (the
# driver's whole budget, default 360 s on a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-check}
mkdir -p "$OUT/logs"
exec > >(tee "$OUT/device_check.log") 2>&1
START=$(date +%s)
BASE_PY=${ARL_DEVICE_CHECK_PYTHON:-$(command -v python3 || command -v python)}
VENV=${ARL_DEVICE_VENV:-.venv-device}
WHEELS=${DEVICE_WHEELS:-.device-wheels}
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1  # never the network
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
echo "== device check: base python $BASE_PY ($("$BASE_PY" -V 2>&1)), venv $VENV, wheels $WHEELS"
command -v nvidia-smi >/dev/null && nvidia-smi -L

install() {
  [ -d "$WHEELS" ] || { echo "no $WHEELS/: run 'bash scripts/device_wheels.sh' where there is a network and carry it"; return 3; }
  if [ ! -x "$VENV/bin/python" ]; then
    "$BASE_PY" -m venv --without-pip "$VENV" || return 4
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # addsitedir (not a bare path line) so the base's own .pth files are processed too
    "$BASE_PY" - >"$site/_arl_device_base.pth" <<'EOF'
import site
dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
for d in dirs:
    print(f"import site; site.addsitedir({d!r})")
EOF
  fi
  local py="$VENV/bin/python"
  "$py" -m pip --version || "$py" -m ensurepip --default-pip || return 5
  local pipi=("$py" -m pip install --no-index --find-links "$WHEELS")
  timeout 120 "${pipi[@]}" "setuptools>=68" wheel || return $?
  timeout 240 "${pipi[@]}" --no-build-isolation -e . || return $?
  timeout 120 "${pipi[@]}" "pytest>=8" "pytest-timeout>=2.3" || return $?  # the test runner (not an install_requires)
  "$py" -c "import arl, gymnasium, cattrs, openai, pytest; print('arl from', arl.__file__)"
}
install >"$OUT/logs/install.log" 2>&1
RC=$?
INSTALL_S=$(( $(date +%s) - START ))
grep -v "is ignored" "$OUT/logs/install.log" | tail -8
echo "install: rc=$RC, ${INSTALL_S} s"
PY="$VENV/bin/python"
[ -x "$PY" ] || PY=$BASE_PY
printf '{"rc": %d, "seconds": %d, "log": "logs/install.log"}\n' "$RC" "$INSTALL_S" >"$OUT/install.json"
"$PY" scripts/device_check.py --out "$OUT" --install "$OUT/install.json"
RC=$?
echo "device check: rc=$RC, $(( $(date +%s) - START )) s in all; results in $OUT/"
exit $RC
