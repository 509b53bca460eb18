"""Run a package's own test suite in a fresh sandbox: the reward and the build's verification.

    result = await run_suite(PACKAGES["toolz"], {"toolz/itertoolz.py": agent_text}, isolation="bwrap")
    result.passed, result.failed, result.first_failure   # counts from pytest's JUnit XML report
    result.score(record["ids"])                           # the share of the pristine suite's tests that passed

The judge's conventions (``arl.envs.bugfix.judge``) where a real test suite allows them
(docs/threat_model.md, "The real-code reward"):

- **Only the package's source files come from the agent.** A pristine tree is unpacked from the
  cached sdist on the host, and only the paths in ``package.sources`` are replaced by the agent's
  copies (regular files, size-bounded, read without following links by the caller): an edited test,
  an added ``conftest.py``, ``sitecustomize.py``, ``.pth`` or setup file changes nothing. A source
  file the caller could not take (None: deleted, a link, a dir, too big) is left out of the tree,
  never replaced by the pristine one.
- **A fresh sandbox, the tree read-only.** The tree and the judge's ``pytest.ini`` lie in a
  judge-owned host dir bound read-only into a sandbox of the same backend (not the agent's: files,
  processes and permissions it left do not reach it), so the code under test cannot rewrite a test
  file, drop a ``conftest.py`` before pytest reaches its dir, or leave a bytecode cache.
- **pytest started so it loads nothing the tree could name**: ``python -I -B`` (no ``PYTHON*``
  variables, no user site, no current dir on ``sys.path``), ``-c`` the judge's ini (the package's
  own ``setup.cfg`` / ``tox.ini`` / ``pyproject.toml`` are not read; its ``pythonpath`` is the
  tree), ``--rootdir`` and ``--confcutdir`` the tree, ``-p no:cacheprovider``, and
  ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` (no plugin of the host's site by entry point).
- **Verdicts from the report file, never from stdout**: pytest's JUnit XML, written into the
  sandbox's own (otherwise empty) work dir, outside the tree. A test counts as passed only under
  its pristine id (`SuiteResult.score`: the ids the pristine suite passed at build time), so a run
  that stops early, collects less or reports made-up tests scores lower, never higher. The
  report must agree with pytest's exit code (0: no failure in it; 1 or 2: at least one), else the
  run is ``contradicted`` and scores 0; a run that leaves no report (killed, ``os._exit`` before
  pytest wrote it, past its time) scores 0. Only a sandbox that cannot start raises
  `arl.envs.bugfix.judge.JudgeUnavailable` (an episode error, not a 0).

What it cannot keep: the package's tests assert inside the pytest process, beside the judged
module, which is imported into it; code written to patch pytest's internals, or to rewrite the
report and exit 0 at interpreter exit, can still forge the verdict (BugFix's judge keeps the
expected values on the host; a real suite's asserts cannot be moved there). docs/threat_model.md
says so.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from arl.envs.bugfix.judge import JudgeUnavailable
from arl.envs.realbugs.packages import Package, ensure_package, package_files
from arl.sandbox.backends import open_sandbox
from arl.sandbox.sandbox import SandboxDied, SandboxLimits, SandboxUnavailable

ARL_PACKAGE = Path(__file__).resolve().parents[2]  # hidden: it holds the task list and its fixes
SUITE_LIMITS = SandboxLimits(wall_s=180.0, cpu_s=120.0, output_bytes=1 << 20)
MAX_SOURCE_BYTES = 1 << 21
REPORT = "arl-report.xml"  # in the judge sandbox's work dir, beside nothing else
# pytest's environment: no plugin by entry point, no options or plugins from variables
JUDGE_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": "", "PYTEST_PLUGINS": "",
             "PYTHONNOUSERSITE": "1"}
CONSISTENT_EXITS = {0: False, 1: True, 2: True}  # pytest's exit code -> whether the report must hold a failure
# The judge's version: bump it with any change here or in `arl.envs.realbugs.build`'s checks that
# can change a verdict, a test id, a count or a failure text. Every record the build caches is keyed
# by `judge_key`, so a changed judge verifies again instead of reading what an older one concluded.
# 1: source files only, into a read-only pristine tree, verdicts from the JUnit report checked
# against pytest's exit code, an unusable source file left out (365b07b).
JUDGE_VERSION = 1


def judge_key() -> list[object]:
    """What, beside a task and its package, decides the verdicts the build caches: `JUDGE_VERSION`,
    the interpreter's version (the suite runs under this one) and pytest's."""
    import pytest

    return [JUDGE_VERSION, list(sys.version_info[:2]), pytest.__version__]


@attrs.frozen
class SuiteResult:
    """One pytest run: test counts from its report, the first failing test and its message, the
    ids of the tests that passed (``classname::name``) and the run's status (``ok``; ``timeout``,
    ``no report``, ``contradicted``, ``exit N``...)."""

    passed: int
    failed: int
    skipped: int
    first_failure: str | None = None
    failure_text: str = ""
    status: str = "ok"
    passed_ids: tuple[str, ...] = attrs.field(default=(), repr=False)

    def verdicts(self, expected: Sequence[str]) -> dict[str, bool]:
        """Pass/fail of each of ``expected`` (the pristine suite's passing test ids): passed only if
        this run reported it passed; all failed for a ``contradicted`` run. A test this run made
        up counts for nothing; one it did not report, as failed.

        >>> SuiteResult(3, 0, 0, passed_ids=("t::a", "t::made_up", "t::b")).verdicts(["t::a", "t::b", "t::c"])
        {'t::a': True, 't::b': True, 't::c': False}
        """
        passed = set(self.passed_ids) if self.status != "contradicted" else set()
        return {name: name in passed for name in expected}

    def score(self, expected: Sequence[str]) -> float:
        """The share of ``expected`` that passed (`verdicts`; 0 when nothing is expected).

        >>> SuiteResult(3, 0, 0, passed_ids=("t::a", "t::made_up", "t::b")).score(["t::a", "t::b", "t::c", "t::d"])
        0.5
        """
        verdicts = self.verdicts(expected)
        return sum(verdicts.values()) / len(verdicts) if verdicts else 0.0


def pytest_argv(package: Package, tree: Path, report: str, *, stop_first: bool = False) -> list[str]:
    """The judge's pytest command, run in ``tree`` (module docstring), its JUnit report to ``report``."""
    return [sys.executable, "-I", "-B", "-m", "pytest", "-c", str(tree.parent / "pytest.ini"),
            "--rootdir", str(tree), "--confcutdir", str(tree), "-q", "-p", "no:cacheprovider",
            *(["-x"] if stop_first else []), f"--junitxml={report}", "-o", "junit_family=xunit2", *package.tests]


def parse_report(text: str) -> SuiteResult:
    """Counts of a pytest JUnit XML report; a test with a ``failure`` or ``error`` failed.

    >>> parse_report('<testsuites><testsuite><testcase classname="t" name="a"/>'
    ...              '<testcase classname="t" name="b"><failure message="boom">x</failure></testcase>'
    ...              '</testsuite></testsuites>')
    SuiteResult(passed=1, failed=1, skipped=0, first_failure='t::b', failure_text='boom\\nx', status='ok')
    """
    root = ET.fromstring(text)
    passed = failed = skipped = 0
    first, why = None, ""
    ids: list[str] = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed += 1
            if first is None:
                first = name
                why = "\n".join(part for part in (bad.get("message", ""), bad.text or "") if part)
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
            ids.append(name)
    return SuiteResult(passed, failed, skipped, first, why, passed_ids=tuple(ids))


def judged_status(parsed: SuiteResult, exit_code: int | None) -> str:
    """``ok`` when pytest's exit code agrees with its report (0: no failure; 1, 2: some),
    ``contradicted`` when it does not (a report rewritten after pytest wrote it), ``exit N`` for
    another exit (pytest's own error, no tests, a forced exit).

    >>> [judged_status(SuiteResult(5, 0, 0), 0), judged_status(SuiteResult(5, 0, 0), 1), judged_status(SuiteResult(0, 0, 0), 5)]
    ['ok', 'contradicted', 'exit 5']
    """
    if exit_code not in CONSISTENT_EXITS:
        return f"exit {exit_code}"
    return "ok" if CONSISTENT_EXITS[exit_code] == (parsed.failed > 0) else "contradicted"


def _write_tree(into: Path, files: Mapping[str, bytes]) -> Path:
    """The judge's dir: ``tree/`` (``files``) and ``pytest.ini``, readable by the sandbox's uid,
    writable by nobody but the host (the dir is bound read-only besides)."""
    tree = into / "tree"
    for path, data in files.items():
        target = tree / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (into / "pytest.ini").write_text(f"[pytest]\npythonpath = {tree}\n")
    for place, _dirs, names in os.walk(into):
        os.chmod(place, 0o555)
        for name in names:
            os.chmod(os.path.join(place, name), 0o444)
    return tree


def _remove(path: Path) -> None:
    for place, _, _ in os.walk(path):
        os.chmod(place, 0o755)
    shutil.rmtree(path, ignore_errors=True)


async def run_suite(
    package: Package, sources: Mapping[str, bytes | None] | None = None, *, isolation: str | None = None,
    stop_first: bool = False, limits: SandboxLimits = SUITE_LIMITS,
) -> SuiteResult:
    """``package``'s test suite against its pristine files with ``sources`` (relative path ->
    bytes, only paths in ``package.sources``) put in their place; a path given as None (or past
    `MAX_SOURCE_BYTES`) is left out of the tree, not replaced by the pristine file. ``stop_first``: stop at the first
    failing test (the build's check that a bug is caught). A run with no report is scored as no
    test passing (status ``timeout``, ``no report``...), unless the sandbox could not start at all
    (`JudgeUnavailable`)."""
    files = package_files(ensure_package(package, fetch=False))
    for path, data in (sources or {}).items():
        if path not in package.sources:
            continue
        if data is None or len(data) > MAX_SOURCE_BYTES:  # never the pristine file in its place
            files.pop(path, None)
        else:
            files[path] = data
    judge_dir = Path(tempfile.mkdtemp(prefix="arl-judge-"))
    try:
        tree = _write_tree(judge_dir, files)
        try:
            sandbox = open_sandbox(limits, backend=isolation, python=True, hide=[ARL_PACKAGE], read_only=[judge_dir])
        except SandboxUnavailable as exc:
            raise JudgeUnavailable(f"the test suite's sandbox cannot start: {exc}") from exc
        try:
            await sandbox.start()
            argv = pytest_argv(package, tree, f"{sandbox.cwd}/{REPORT}", stop_first=stop_first)
            result = await sandbox.exec(argv, workdir=str(tree), env=JUDGE_ENV)
            if result.status == "error":
                raise JudgeUnavailable(f"the test suite could not run: {result.error}", result)
            report = sandbox.host_path(REPORT)
            text = report.read_text(errors="replace") if report.is_file() and not report.is_symlink() else ""
        except SandboxDied as exc:
            raise JudgeUnavailable(f"the test suite's sandbox died: {exc}") from exc
        finally:
            await sandbox.stop()
    finally:
        _remove(judge_dir)
    try:
        parsed = parse_report(text)
    except ET.ParseError:
        tail = (result.stdout + result.stderr)[-2000:]
        return SuiteResult(0, 0, 0, None, tail, "no report" if result.status == "ok" else result.status)
    status = judged_status(parsed, result.exit_code) if result.status == "ok" else result.status
    return attrs.evolve(parsed, status=status)


__all__ = ["JUDGE_ENV", "JUDGE_VERSION", "REPORT", "SUITE_LIMITS", "SuiteResult", "judge_key", "judged_status",
           "parse_report", "pytest_argv", "run_suite"]
