"""The bug-fix reward's judge: hidden tests the code under test cannot reach.

    verdict = await judge(task, workdir, isolation="bwrap")   # Verdict(passed=frozenset({...}), total=11, ...)

The pattern (docs/threat_model.md, "Test-based rewards"), for this judge and any a user writes:

- **The judged code decides nothing.** Each hidden test (`arl.envs.bugfix.tasks.TestCase`) runs
  in a process of its own (`arl.envs.bugfix.run_tests`) that imports the agent's module, calls one
  function and prints what it returned. The expected value never enters that process; the host
  compares the printed result with it. A module that patches the runner, reads its stack or
  prints fake lines can at most print a value, and passes only if the value is right.
- **A fresh sandbox per case, not the agent's.** The agent's top-level ``*.py`` files are copied
  (regular files only, never through a link, size-bounded) into a scratch dir bound read-only
  into a new sandbox (of the agent's backend, `arl.sandbox.backends.open_sandbox`) for every
  runner process: its own work dir, uid and process cgroup (a container per case under podman or
  docker). Processes, files or permissions the agent left in its own work dir do not reach the
  judge, and one case's process cannot leave state, processes or a full process table for another:
  judged code that forks until refused exhausts its own case's limit only.
- **A judge that cannot start is an error, not a 0.** Every case's runner writes `READY` before
  the agent's code is imported. A case without it is run again, alone, in a fresh sandbox once
  every other case has ended; only if it still does not start (no interpreter, a sandbox that
  cannot start, a host too loaded to start a process in ``case_limits.wall_s``) does the judge
  raise `JudgeUnavailable`, so a broken machine cannot train on all-zero rewards.
- **Why that error stays masked.** The episode then ends as an env error, left out of the loss
  (``rollout.mask_abnormal``). Judged code cannot cause it: nothing the code does can remove a
  line already written, and the re-run that decides runs where no judged code has run (its own
  uid, work dir and cgroup, nothing of another case alive: each case's sandbox is closed, its uid's
  processes killed, before the re-run starts). What is left is the machine's fault, and a 0 for
  it would punish the policy for the host. (Before each case had its own sandbox, a case that
  forked until refused made the cases beside it fail to start, and a wrong fix escaped its 0
  through this mask: tests/envs/test_adversarial_judge.py.)

Costs: one sandbox and one sandboxed interpreter start per case, ``concurrency`` of them at a time. Measured on
2 cores busy with other work (bwrap, root, seed 3's 11 tests; medians of 5-8, the load varying):
0.6-1.1 s a task with one case per process, 0.27-0.85 s with all of them in one
(``cases_per_process``); the old in-process runner took ~0.08 s on the same machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from arl.envs.bugfix import run_tests
from arl.envs.bugfix.tasks import BugFixTask, TestCase
from arl.envs.latency import ParetoLatency
from arl.envs.reward_spec import RewardResult, RewardSpec, RewardUnavailable
from arl.sandbox.backends import open_sandbox
from arl.sandbox.sandbox import CommandResult, Sandbox, SandboxLimits, SandboxUnavailable

RUNNER = Path(run_tests.__file__)
ARL_PACKAGE = Path(__file__).resolve().parents[2]  # hidden in the judge's sandbox: it holds the task generator
CASE_LIMITS = SandboxLimits(wall_s=10.0, cpu_s=5.0, output_bytes=1 << 16)
MAX_FILE_BYTES = 1 << 20  # a copied module larger than this is left out (the import then fails)
MAX_FILES = 64


SPEC_NAME = "bugfix-hidden-tests"


def latency_key(seed: int) -> str:
    """The key `HiddenTestsSpec`'s ``test_latency`` draws task ``seed``'s wait from
    (`arl.envs.latency.ParetoLatency.draw_s`): the seed alone, so every mode, run and group member
    playing the task waits the same.

    >>> latency_key(7)
    'bugfix-tests|7'
    """
    return f"bugfix-tests|{int(seed)}"


class JudgeUnavailable(RewardUnavailable):
    """The hidden tests could not run (not the agent's fault): the episode has no reward
    (`arl.envs.reward_spec.RewardUnavailable`, so it is masked as every reward spec's failure is)."""

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message, spec=SPEC_NAME)
        self.result = result


@attrs.frozen
class Verdict:
    """What the judge decided: ``passed`` test names, ``total`` tests, ``details`` per failed test."""

    passed: frozenset[str]
    total: int
    details: dict[str, str] = attrs.field(factory=dict)

    @property
    def score(self) -> float:
        return len(self.passed) / self.total if self.total else 0.0


def interpreter() -> str:
    """The interpreter the runner uses: the real binary behind this one (``-S`` needs no venv), so a
    venv reached through a symlink, or living outside the checkout, is found all the same."""
    return os.path.realpath(sys.executable)


def copy_sources(workdir: Path, into: Path) -> list[str]:
    """Copy the agent's top-level ``*.py`` files into ``into``: regular files only (never through a
    link, never a FIFO or device), at most `MAX_FILES` of at most `MAX_FILE_BYTES`. Returns their names."""
    copied: list[str] = []
    with os.scandir(workdir) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if len(copied) >= MAX_FILES:
                break
            if not entry.name.endswith(".py") or not entry.is_file(follow_symlinks=False):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                continue
            target = into / entry.name
            target.write_bytes(data)
            target.chmod(0o644)
            copied.append(entry.name)
    return copied


def outcomes_of(result: CommandResult, n: int) -> tuple[bool, list[tuple[str, Any]]]:
    """(the runner started, what it reported for each of its ``n`` cases) from one runner's command
    result. Each report is ``("value", v)``, ``("raises", name)`` or ``("error", why)``. A case with
    no line (the process died or hung there) is an error; more lines than cases (the code under
    test wrote some) make every case of the process an error, since which are the runner's cannot
    be told."""
    first, _, rest = result.stdout.partition("\n")
    if first != run_tests.READY:
        return False, [("error", "the runner did not start")] * n
    lines = rest.splitlines()
    if len(lines) > n:
        return True, [("error", f"{len(lines)} result lines for {n} cases")] * n
    reports = [_parse(line) for line in lines]
    return True, reports + [("error", f"no result ({result.status})")] * (n - len(reports))


def _parse(line: str) -> tuple[str, Any]:
    try:
        kind, payload = json.loads(line)
        if kind == "value":
            return "value", run_tests.decode(payload)
        if kind in ("raises", "error") and isinstance(payload, str):
            return kind, payload
    except (ValueError, TypeError, RecursionError):
        pass
    return "error", "malformed result"


def passes(case: TestCase, reported: tuple[str, Any]) -> bool:
    """The host's comparison: the test's own ``==`` on plain data, or the exception's name."""
    kind, got = reported
    if kind != case.outcome or kind not in ("value", "raises"):
        return False
    try:
        return bool(got == case.value) if kind == "value" else got == case.value
    except RecursionError:
        return False


async def judge(
    task: BugFixTask, workdir: Path, *, isolation: str | None = None, case_limits: SandboxLimits = CASE_LIMITS,
    concurrency: int = 16, cases_per_process: int = 1, wait_s: float = 0.0,
) -> Verdict:
    """Run ``task``'s hidden tests against the ``*.py`` files of ``workdir`` (see the module
    docstring), ``concurrency`` runners at a time, each in a sandbox of its own of backend
    ``isolation`` (None: the configured one). Raises `JudgeUnavailable` when a runner could not
    start, alone, on a second try.

    ``wait_s`` > 0 makes the task's first hidden test a slow one: its runner process sleeps that
    long before the test's call (`arl.envs.bugfix.run_tests`), in its sandbox, whose wall limit
    is ``case_limits.wall_s + wait_s``; the run takes that much longer, its verdict is the same.

    ``cases_per_process``: 1 (default) gives every test a process (and sandbox) of its own; more
    share one process (each a sandboxed command: ~5x cheaper for a whole task in one), which is as
    safe against forging, since the expected values still stay on the host, but lets one test's
    side effects or hang reach the tests after it in that process (as in one pytest run)."""
    scratch = Path(tempfile.mkdtemp(prefix="arl-judge-"))
    try:
        code = scratch / "code"
        code.mkdir()
        for path in (scratch, code):
            path.chmod(0o755)  # the sandbox's uid reads them (bound read-only)
        shutil.copyfile(RUNNER, scratch / RUNNER.name)
        (scratch / RUNNER.name).chmod(0o644)
        copy_sources(workdir, code)
        command = f"{interpreter()} -I -S -B {scratch / RUNNER.name} {code}"
        gate = asyncio.Semaphore(concurrency)

        slow = task.cases[0] if wait_s > 0 and task.cases else None

        async def one(cases: tuple[TestCase, ...]) -> CommandResult:
            job = {"module": task.module, "cases": [
                {"function": case.function, "args": run_tests.encode(case.args),
                 **({"wait_s": wait_s} if case is slow else {})} for case in cases]}
            limits = attrs.evolve(case_limits, wall_s=case_limits.wall_s + wait_s) if any(case is slow for case in cases) else case_limits
            async with gate:
                sandbox = open_sandbox(limits, backend=isolation, python=True, hide=[ARL_PACKAGE],
                                       read_only=[scratch])
                try:
                    return await sandbox.run(command, stdin=json.dumps(job) + "\n")
                finally:
                    await sandbox.stop()

        step = max(1, cases_per_process)
        chunks = [task.cases[i:i + step] for i in range(0, len(task.cases), step)]
        results = list(await asyncio.gather(*(one(chunk) for chunk in chunks)))
        for i, (chunk, result) in enumerate(zip(chunks, results, strict=True)):
            if not outcomes_of(result, len(chunk))[0]:  # did not start: again, alone (module docstring)
                results[i] = await one(chunk)
    except SandboxUnavailable as exc:
        raise JudgeUnavailable(f"the judge's sandbox cannot start: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    passed, details = set(), {}
    for cases, result in zip(chunks, results, strict=True):
        started, reports = outcomes_of(result, len(cases))
        if not started:
            why = result.error or result.stderr.strip()[-500:] or f"status {result.status}"
            raise JudgeUnavailable(f"the hidden tests' runner could not start, alone on a second try ({why}); "
                                   f"command: {command}", result)
        for case, reported in zip(cases, reports, strict=True):
            if passes(case, reported):
                passed.add(case.name)
            else:
                details[case.name] = reported[0] if reported[0] != "value" else "wrong value"
    return Verdict(frozenset(passed), len(task.cases), details)


class HiddenTestsSpec(RewardSpec):
    """The BugFix reward as a `arl.envs.reward_spec.RewardSpec`: `judge` on the live sandbox's work
    dir, in sandboxes of the same backend; ``tests`` is each hidden test's pass/fail, ``extra`` the
    counts and why each failed test failed. ``timeout_s`` bounds the whole judge: its cases are
    bounded by ``case_limits`` each, 11 cases at 16 at a time take one ``wall_s`` (10 s), and each
    case that did not start is re-run alone (another ``wall_s`` each, 110 s if none started), so
    the default of 300 s is only reached by a judge that could not have decided anyway.

    ``test_latency`` (`arl.envs.latency.ParetoLatency`, or a mapping of its fields; None: off):
    a test suite whose slow test waits. Task seed s's first hidden test sleeps
    ``test_latency.draw_s(latency_key(s))`` seconds in its sandboxed process before its call
    (`judge`'s ``wait_s``): a heavy-tailed test time, the same for a task on every run, that
    changes no verdict. ``timeout_s`` is raised by ``cap_s``, the most it can add."""

    name = SPEC_NAME

    def __init__(self, *, timeout_s: float = 300.0, case_limits: SandboxLimits = CASE_LIMITS, concurrency: int = 16,
                 cases_per_process: int = 1, test_latency: ParetoLatency | Mapping[str, Any] | None = None) -> None:
        self.test_latency = ParetoLatency.from_config(test_latency, option="test_latency")
        self.timeout_s = float(timeout_s) + (self.test_latency.cap_s if self.test_latency else 0.0)
        self.case_limits = case_limits
        self.concurrency = concurrency
        self.cases_per_process = cases_per_process

    def wait_s(self, task: BugFixTask) -> float:
        """How long ``task``'s slow test waits (0 without ``test_latency``)."""
        return self.test_latency.draw_s(latency_key(task.seed)) if self.test_latency else 0.0

    async def score(self, sandbox: Sandbox, task: BugFixTask) -> RewardResult:
        verdict = await judge(task, sandbox.workdir, isolation=sandbox.isolation, case_limits=self.case_limits,
                              concurrency=self.concurrency, cases_per_process=self.cases_per_process,
                              wait_s=self.wait_s(task))
        return RewardResult(verdict.score, {case.name: case.name in verdict.passed for case in task.cases},
                            {"passed": len(verdict.passed), "total": verdict.total, "failed": dict(verdict.details)})


__all__ = ["CASE_LIMITS", "SPEC_NAME", "HiddenTestsSpec", "JudgeUnavailable", "Verdict", "copy_sources", "interpreter", "judge",
           "latency_key", "outcomes_of", "passes"]
