"""arl installed as a plain package (not the editable checkout) runs from any directory.

`pip install` builds a wheel from a copy of the sources into a NEW venv, which reuses the test
venv's dependencies without seeing the editable checkout: a `.pth` file in the new venv's
site-packages names the test venv's site-packages. A `.pth` path line is appended to sys.path,
but the `.pth` files inside that directory are not processed, so the editable install's import
hook (`__editable___arl_*_finder`) stays inactive and `import arl` finds the installed copy.
Then, from a directory that is not the checkout and with PYTHONPATH unset, `arl configs` lists
the packaged configs and `arl train tiny_frozenlake_gigpo steps=2 ...` trains and checkpoints.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "runs", "__pycache__", "*.pyc", ".pytest_cache",
    ".ruff_cache", ".hypothesis", ".ipynb_checkpoints",
)


def _env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH")}
    env.update(
        VIRTUAL_ENV=str(venv),
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PYTHONNOUSERSITE="1",
        HF_HUB_OFFLINE=env.get("HF_HUB_OFFLINE", "1"),  # as tests/conftest.py; the tiny model is local
        TOKENIZERS_PARALLELISM=env.get("TOKENIZERS_PARALLELISM", "false"),
    )
    return env  # ARL_HOME (the model cache) is inherited: the tiny model is built once for all tests


def _run(args: list[str], venv: Path, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=_env(venv))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A new venv with arl pip-installed (non-editable) and the test venv's packages as dependencies."""
    base = tmp_path_factory.mktemp("install")
    src, venv, work = base / "src", base / "venv", base / "work"
    work.mkdir()
    shutil.copytree(ROOT, src, symlinks=True, ignore=_NOT_SOURCES)  # no stale build/ or egg-info of the checkout
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "arl_test_deps.pth").write_text("".join(f"{path}\n" for path in deps))
    before = _run([str(python), "-c", "import arl"], venv, work, timeout=120)  # the checkout stays invisible
    assert before.returncode != 0 and "No module named 'arl'" in before.stderr, before.stderr[-2000:]
    start = time.perf_counter()
    proc = _run([str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                 "--ignore-installed", "--disable-pip-version-check", "-q", str(src)], venv, work, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"pip install: {time.perf_counter() - start:.1f} s")
    return {"venv": venv, "python": python, "site": site, "work": work, "deps": list(deps)}


@pytest.mark.timeout(600)
def test_installed_arl_is_the_installed_copy_not_the_checkout(installed):
    probe = ("import importlib.util, sys, arl, arl.config as c; "
             "print(arl.__file__); print(c.CONFIG_DIR); "
             "print(any('__editable__' in m for m in sys.modules)); "
             "print(importlib.util.find_spec('torch') is not None)")
    proc = _run([str(installed["python"]), "-c", probe], installed["venv"], installed["work"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arl_file, config_dir, editable, torch_found = proc.stdout.split("\n")[:4]
    assert Path(arl_file).is_relative_to(installed["site"]), arl_file  # not /work/main or another checkout
    assert not Path(arl_file).is_relative_to(ROOT), arl_file
    assert Path(config_dir) == installed["site"] / "arl" / "configs"
    assert (Path(config_dir) / "tiny_frozenlake_gigpo.yaml").is_file()  # package data made it into the wheel
    assert editable == "False"  # the editable finder's .pth was not processed
    assert torch_found == "True"  # the dependencies come through the .pth line


@pytest.mark.timeout(600)
def test_installed_cli_lists_the_packaged_configs(installed):
    proc = _run([str(installed["venv"] / "bin" / "arl"), "configs"], installed["venv"], installed["work"],
                timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {line.split()[0] for line in proc.stdout.splitlines()[1:] if line.strip()}
    assert {"tiny_frozenlake_gigpo", "tiny_sokoban_gigpo"} <= names
    assert str(installed["site"]) in proc.stdout.splitlines()[0]


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_installed_arl_trains_a_packaged_config_from_another_directory(installed):
    runs = installed["work"] / "runs"
    start = time.perf_counter()
    proc = _run([str(installed["venv"] / "bin" / "arl"), "train", "tiny_frozenlake_gigpo", "steps=2",
                 "sft.steps=2", "eval.num_seeds=4", "rollout.num_groups=2", "rollout.group_size=2",
                 f"out_dir={runs}"], installed["venv"], installed["work"], timeout=840)
    print(f"arl train (installed copy): {time.perf_counter() - start:.1f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = runs / "tiny_frozenlake_gigpo"
    checkpoints = sorted(run_dir.glob("ckpt_*"))
    assert checkpoints, sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else "no run directory"
    assert (checkpoints[-1] / "config.json").is_file()
    assert (run_dir / "metrics.jsonl").is_file()
