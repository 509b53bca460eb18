"""scripts/import_graph.py: arl's import graph has no cycle and no upward import, and the check
finds both when they are there (on small packages written here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "import_graph.py"


def _script():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package named arl under tmp_path: {relative path: source}."""
    for rel, source in {"__init__.py": "", **files}.items():
        path = tmp_path / "arl" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path / "arl"


def test_arl_has_no_cycle_and_no_upward_import():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    graph = proc.stdout
    # the graph marks the two kinds of imports apart: rollout imports the engine at module level,
    # the engine loads zoo models lazily
    assert "arl.rollout\n" in graph and "\narl.cli\n" in graph
    assert "  ->       arl.config" in graph and "  ~>       arl.models" in graph
    # the config records sit at the bottom: arl.config imports no arl module
    assert "arl.config\narl.engine\n" in graph


def test_a_cycle_and_the_upward_imports_fail(tmp_path):
    package = _package(tmp_path, {
        "config.py": "import arl.train\n",  # module level, upward
        "engine/__init__.py": "def f():\n    from arl.train import x\n",  # function level, upward
        "rollout/__init__.py": "",
        "rollout/base.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from arl.rollout.proxy import P\n",
        "rollout/proxy.py": "from .base import B\nclass P:\n    from arl import config\n",
        "train/__init__.py": "",
        "newpkg/__init__.py": "",
    })
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quiet", "--package-dir", str(package)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    errors = proc.stderr
    assert "cycle between modules arl.rollout.base, arl.rollout.proxy" in errors
    assert "arl.rollout.base :> arl.rollout.proxy (arl/rollout/base.py:3)" in errors  # TYPE_CHECKING
    assert "arl.rollout.proxy -> arl.rollout.base (arl/rollout/proxy.py:1)" in errors  # relative import
    assert "upward import arl.config -> arl.train (a higher tier): arl/config.py:1" in errors
    assert "upward import arl.engine ~> arl.train (a higher tier): arl/engine/__init__.py:2" in errors
    assert "arl.newpkg has no place in LAYERS" in errors
    assert errors.count("ERROR:") == 4  # a class body's import runs at import time: rollout -> config is fine


def test_function_level_upward_imports_can_be_allowed(tmp_path):
    graph = _script()
    package = _package(tmp_path, {"engine.py": "def f():\n    import arl.train\n", "train.py": "",
                                  "rollout.py": "import arl.train\n"})
    graph.ALLOWED_UPWARD = {("arl.engine", "arl.train"): "why", ("arl.algo", "arl.cli"): "stale"}
    units, problems = graph.check(*graph.scan(package))
    assert units["arl.engine"]["arl.train"].keys() == {graph.FUNCTION}
    assert problems == [  # a module-level upward import is never allowed; a stale allowance is reported
        "upward import arl.rollout -> arl.train (a higher tier): arl/rollout.py:1",
        "ALLOWED_UPWARD lists arl.algo ~> arl.cli, which no longer occurs: remove it",
    ]
    assert "(allowed: why)" in graph.render(units)
