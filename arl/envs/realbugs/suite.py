"""Run a package's own test suite in a fresh sandbox: the reward and the build's verification.

    result = await run_suite(PACKAGES["toolz"], {"toolz/itertoolz.py": agent_text}, isolation="bwrap")
    result.passed, result.failed, result.first_failure   # counts from pytest's JUnit XML report

The judge's conventions (``arl.envs.bugfix.judge``) where a real test suite allows them: a sandbox
of its own per run (not the agent's: files, processes and permissions the agent left do not reach
it), built from the pristine unpacked sdist in the cache with only the package's ``sources``
replaced by the agent's copies (regular files, size-bounded), so an edited test, conftest or
setup file changes nothing; a run that cannot start raises `arl.envs.bugfix.judge.JudgeUnavailable`
instead of scoring 0. The reward's denominator is the number of tests the pristine suite has
(recorded at build time), not what the judged run reports, so code that breaks collection scores
lower, never higher.

What it cannot keep: the package's tests compare values inside the pytest process, next to the
judged code, so code written to patch pytest could forge its report (the BugFix judge keeps the
expected values on the host; a real suite's asserts cannot be moved there). docs/guide.md says so.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

import attrs

from arl.envs.bugfix.judge import JudgeUnavailable
from arl.envs.realbugs.packages import Package, ensure_package, package_files
from arl.sandbox.backends import open_sandbox
from arl.sandbox.sandbox import SandboxLimits, SandboxUnavailable

ARL_PACKAGE = Path(__file__).resolve().parents[2]  # hidden: it holds the task list and its fixes
SUITE_LIMITS = SandboxLimits(wall_s=180.0, cpu_s=120.0, output_bytes=1 << 20)
MAX_SOURCE_BYTES = 1 << 21
REPORT = "arl-report.xml"


@attrs.frozen
class SuiteResult:
    """One pytest run: test counts from its report, the first failing test and its message."""

    passed: int
    failed: int
    skipped: int
    first_failure: str | None = None
    failure_text: str = ""
    status: str = "ok"

    def score(self, total: int) -> float:
        """The share of the pristine suite's ``total`` tests that passed (0 <= score <= 1)."""
        return min(self.passed, total) / total if total else 0.0


def pytest_command(package: Package, *, stop_first: bool = False) -> str:
    """The command a run executes in the package's root (the sandbox's work dir)."""
    flags = "-x " if stop_first else ""
    return (f"PYTHONPATH=. {sys.executable} -B -m pytest -q -p no:cacheprovider {flags}"
            f"--junitxml={REPORT} -o junit_family=xunit2 {' '.join(package.tests)}")


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
    for case in root.iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed += 1
            if first is None:
                first = f"{case.get('classname', '')}::{case.get('name', '')}"
                why = "\n".join(part for part in (bad.get("message", ""), bad.text or "") if part)
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return SuiteResult(passed, failed, skipped, first, why)


async def run_suite(
    package: Package, sources: Mapping[str, bytes] | None = None, *, isolation: str | None = None,
    stop_first: bool = False, limits: SandboxLimits = SUITE_LIMITS,
) -> SuiteResult:
    """``package``'s test suite against its pristine files with ``sources`` (relative path ->
    bytes, only paths in ``package.sources``) put in their place. ``stop_first``: stop at the first
    failing test (the build's check that a bug is caught). A run with no report is scored as no
    test passing (status ``timeout``, ``crashed``...), unless the sandbox could not start at all
    (`JudgeUnavailable`)."""
    files = package_files(ensure_package(package, fetch=False))
    for path, data in (sources or {}).items():
        if path in package.sources and len(data) <= MAX_SOURCE_BYTES:
            files[path] = data
    try:
        sandbox = open_sandbox(limits, backend=isolation, python=True, hide=[ARL_PACKAGE])
    except SandboxUnavailable as exc:
        raise JudgeUnavailable(f"the test suite's sandbox cannot start: {exc}") from exc
    try:
        for path, data in files.items():
            sandbox.write_file(path, data)
        result = await sandbox.run(pytest_command(package, stop_first=stop_first))
        if result.status == "error":
            raise JudgeUnavailable(f"the test suite could not run: {result.error}", result)
        report = sandbox.host_path(REPORT)
        text = report.read_text(errors="replace") if report.is_file() and not report.is_symlink() else ""
    finally:
        await sandbox.stop()
    try:
        parsed = parse_report(text)
    except ET.ParseError:
        tail = (result.stdout + result.stderr)[-2000:]
        return SuiteResult(0, 0, 0, None, tail, "no report" if result.status == "ok" else result.status)
    return parsed if result.status == "ok" else attrs.evolve(parsed, status=result.status)


__all__ = ["REPORT", "SUITE_LIMITS", "SuiteResult", "parse_report", "pytest_command", "run_suite"]
