"""tests/interop: agent frameworks, unchanged, against arl (`make interop`).

Two gates, each a skip with its reason, or a failure under ``ARL_REQUIRE_INTEROP=1``:

- **A loopback-only network namespace.** Third-party frameworks run here with their default
  settings; nothing they might send may leave the machine, so these tests run only where this
  process sees no network interface but ``lo`` (`make interop` runs them under ``unshare -n``).
  Every framework telemetry switch is also off, in this process (for the in-process agents) as in
  every push-mode agent (`arl.agents.process.TELEMETRY_OFF`, with `arl.agents.process.NETWORK_OFF`).
- **The frameworks.** Push mode runs each agent program (``agents/*_agent.py``) under the interop
  venv's python (``.venv-interop``, built by ``scripts/interop_venv.sh``; ``ARL_INTEROP_VENV``
  names another); in process, the framework must import in arl's own venv (setup.cfg's
  ``interop`` extra, which `make interop` installs).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from arl.agents.process import NETWORK_OFF, TELEMETRY_OFF

ROOT = Path(__file__).resolve().parents[2]
INTEROP_VENV = Path(os.environ.get("ARL_INTEROP_VENV") or ROOT / ".venv-interop")
STAMP = ".arl-interop"  # written by scripts/interop_venv.sh once the venv imports all four
REQUIRE = os.environ.get("ARL_REQUIRE_INTEROP") == "1"


def unavailable(why: str) -> None:
    """Skip with the reason, or fail under ARL_REQUIRE_INTEROP=1."""
    if REQUIRE:
        pytest.fail(f"ARL_REQUIRE_INTEROP=1, but {why}", pytrace=False)
    pytest.skip(why)


def other_interfaces() -> list[str]:
    """Network interfaces of this process's namespace besides ``lo`` (/proc/self/net/dev: the
    process's own namespace; /sys/class/net shows the namespace sysfs was mounted in)."""
    try:
        lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    except OSError:
        return ["<unknown: /proc/self/net/dev unreadable>"]
    return [name for name in (line.split(":", 1)[0].strip() for line in lines) if name and name != "lo"]


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Every test here: in a loopback-only namespace, with every framework telemetry switch off in
    this process too (set before a test imports a framework; undone after, so the rest of a
    session that collects this directory keeps its environment)."""
    others = other_interfaces()
    if others:
        unavailable(f"not in a loopback-only network namespace (interfaces {others}): the frameworks run "
                    "only under `make interop` (unshare -n)")
    for name, value in {**TELEMETRY_OFF, **NETWORK_OFF}.items():
        if name not in os.environ:
            monkeypatch.setenv(name, value)


@pytest.fixture
def interop_python() -> str:
    python = INTEROP_VENV / "bin" / "python"
    if not (INTEROP_VENV / STAMP).is_file() or not python.exists():
        unavailable(f"no interop venv at {INTEROP_VENV}: `make interop` builds it (scripts/interop_venv.sh)")
    return str(python)


def need_in_process(module: str) -> None:
    """The framework must import in arl's own process (setup.cfg's `interop` extra)."""
    if importlib.util.find_spec(module) is None:
        unavailable(f"{module} is not installed in arl's venv: pip install -e '.[interop]' (`make interop` does)")


@pytest.fixture
def require_module():
    """``require_module("smolagents")``: skip (or fail) unless it imports in this process."""
    return need_in_process
