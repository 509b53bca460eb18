"""RealBugFixEnv: fix a bug put into a real PyPI package, judged by its own tests (``arl/RealBugFix-v0``).

    env = gymnasium.make("arl/RealBugFix-v0").unwrapped
    observation, info = env.reset(seed=3)    # the failing test, its message, the repository's layout

`arl.envs.bugfix.env.BugFixEnv`'s interface, tools (``bash``, ``editor``, ``submit``), turn
counting and sandbox, on other tasks: seed ``s`` is ``TASKS[s % len(TASKS)]``
(`arl.envs.realbugs.tasks`), the unpacked sdist of a pinned package (`arl.envs.realbugs.packages`)
with one mutated line. The agent sees the package (its sources and its tests) and the test that
fails first on the bug with its message (recorded by the build). Reward at ``submit()`` or at
the step limit: the share of the package's tests that pass (`arl.envs.realbugs.suite.run_suite`:
a fresh sandbox from the pristine sdist with the agent's copies of the package's source files).
The package is fetched on first use and each task checked on first use (both cached under
``$ARL_HOME/realbugs``); ``python -m arl.envs.realbugs.build`` does all of it ahead of time.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

from arl.envs.bugfix.env import BugFixEnv
from arl.envs.bugfix.judge import JudgeUnavailable
from arl.envs.realbugs.build import broken_record, package_record, task_record
from arl.envs.realbugs.packages import PACKAGES, PackageUnavailable, ensure_package, package_files
from arl.envs.realbugs.suite import MAX_SOURCE_BYTES, run_suite
from arl.envs.realbugs.tasks import TASKS, RealBug
from arl.envs.reward_spec import RewardResult, RewardSpec, RewardUnavailable
from arl.sandbox.sandbox import Sandbox, SandboxLimits

AGENT_LIMITS = SandboxLimits(wall_s=60.0, cpu_s=60.0, output_bytes=1 << 20)  # a test file runs in a few seconds


def task_for(seed: int) -> RealBug:
    if not TASKS:
        raise ValueError("arl/RealBugFix-v0 has no task list (arl/envs/realbugs/tasks.json is empty)")
    return TASKS[int(seed) % len(TASKS)]


class RealBugFixEnv(BugFixEnv):
    """One real package with one mutated line per seed (`task_for`), judged by the package's tests."""

    def __init__(self, *, max_steps: int = 30, limits: SandboxLimits | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("reward_spec", PackageTestsSpec())
        super().__init__(max_steps=max_steps, limits=limits or AGENT_LIMITS, **kwargs)
        self.bug: RealBug | None = None
        self.record: dict[str, Any] = {}

    @property
    def instructions(self) -> str:
        return (
            "You are a software engineer fixing a bug in a real Python package (the current directory: "
            "its sources and its own tests). Tools: `bash` runs a command (no network; "
            "`python -m pytest -x -q TESTS` runs tests), `editor` views and edits files, `submit` ends "
            "the episode. The reward is the share of the package's tests that pass after your last "
            f"action. You have {self.max_steps} turns; the last one submits."
        )

    def render(self) -> str | None:
        return self._observation() if self.render_mode == "ansi" and self.bug is not None else None

    def _observation(self) -> str:
        assert self.bug is not None
        package = PACKAGES[self.bug.package]
        failure = self.record.get("failure_text", "").strip()
        failure = failure[-1500:] if failure else "(no message)"
        return (f"Package: {package.requirement}. A test of the package fails: {self.record.get('first_failure')}\n"
                f"{failure}\nTests: {' '.join(package.tests)}. Find and fix the bug in the package's code.")

    def _load_task(self, seed: int) -> RealBug:
        bug = task_for(seed)
        files = package_files(ensure_package(PACKAGES[bug.package]))  # fetched once, then offline
        self.record = task_record(bug, self.isolation)  # checked once (seconds), then cached
        files[bug.path] = bug.apply(files[bug.path].decode()).encode()
        self.bug, self._files = bug, files
        return bug

    def _write_task(self) -> None:
        assert self.sandbox is not None
        for path, data in self._files.items():
            self.sandbox.write_file(path, data)

    def _final_files(self) -> dict[str, str | None]:  # type: ignore[override]
        """The package's source files as the agent left them (`read_sources`): all the judge reads,
        every path a key (None: the judge could not take it, e.g. deleted; `rescore_episode`)."""
        assert self.sandbox is not None and self.bug is not None
        return {path: None if data is None else data.decode("utf-8", "surrogateescape")
                for path, data in read_sources(self.bug.package, self.sandbox.workdir).items()}


class PackageTestsSpec(RewardSpec):
    """The reward of `RealBugFixEnv`: the share of the package's own tests that pass with the
    agent's copies of its source files (`arl.envs.realbugs.suite.run_suite`, a sandbox of its own
    from the pristine tree, pytest isolated from the tree; docs/threat_model.md, "The real-code
    reward"). ``tests``: each test of the pristine suite's list from the build
    (`arl.envs.realbugs.build.package_record`) by id, passed only if this run reported it passed,
    so the denominator is that list's length. ``extra``: ``suite_status`` (`run_suite`'s),
    ``tests_broken`` (how many of those tests the task's bug breaks, `build.broken_record`) and
    ``tests_broken_passed`` (the share of them passing now: 0 for the unfixed bug, 1 for a fix),
    a sharper signal than the reward, where an unfixed submission scores ~0.98; the env reports
    both in its last step's info."""

    name = "package-tests"
    timeout_s = 600.0

    async def score(self, sandbox: Sandbox, task: Any) -> RewardResult:
        sources = await asyncio.to_thread(read_sources, task.package, sandbox.workdir)
        return await self.score_sources(sources, task, sandbox.isolation)

    async def score_sources(self, sources: dict[str, bytes | None], task: Any, isolation: str | None) -> RewardResult:
        """The reward of ``sources`` (the package's source files, relative path -> bytes, None for
        one the agent left unusable: `read_sources`) for ``task``."""
        package = PACKAGES[task.package]
        try:
            result = await run_suite(package, sources, isolation=isolation)
        except JudgeUnavailable as exc:
            raise RewardUnavailable(f"{exc}; check the sandbox backend", spec=self.name) from exc
        except PackageUnavailable as exc:  # re-scoring on a machine that never built the cache
            raise RewardUnavailable(str(exc), spec=self.name) from exc
        expected = (await asyncio.to_thread(package_record, task.package, isolation))["ids"]
        verdicts = result.verdicts(expected)
        broken = (await asyncio.to_thread(broken_record, task, isolation))["broken"]
        return RewardResult(result.score(expected), verdicts, extra={
            "suite_status": result.status, "tests_broken": len(broken),
            "tests_broken_passed": sum(verdicts[name] for name in broken) / len(broken) if broken else 1.0})


def read_sources(package: str, workdir: Path) -> dict[str, bytes | None]:
    """The package's source files (`arl.envs.realbugs.packages.Package.sources`) as ``workdir``
    holds them, every one: what the judge puts into its pristine tree, and all of it. None for a
    file that is not there as a regular file within bounds (deleted, a link, a dir, past
    `MAX_SOURCE_BYTES`): the judge leaves it out of the tree, never falls back to the pristine one."""
    return {path: _read_regular(workdir, path) for path in PACKAGES[package].sources}


async def rescore_episode(seed: int, files: dict[str, str], spec: RewardSpec | None = None, *,
                          isolation: str | None = None) -> RewardResult:
    """Score a stored RealBugFix episode again without replaying it (`arl eval --rescore`): task
    ``seed``'s final ``files`` (the package's source files as the episode ended with them, stored
    as its last step's ``info["final_files"]``, each source path a key, None for one left out) scored by ``spec`` (None: `PackageTestsSpec`) in a
    fresh sandbox, as `arl.envs.bugfix.env.rescore_episode` does for BugFix. Raises the spec's
    `arl.envs.reward_spec.RewardError` when it cannot decide (e.g. `RewardUnavailable` where the
    package is not in the cache and PyPI cannot be reached)."""
    from arl.envs.bugfix.env import rescore_episode as rescore_bugfix

    spec = spec if spec is not None else PackageTestsSpec()
    task = task_for(seed)
    if missing := [path for path in PACKAGES[task.package].sources if path not in files]:
        raise RewardUnavailable(f"the stored episode of seed {seed} holds no final copy of {', '.join(missing)} "
                                "(recorded before RealBugFix stored its package's sources): it cannot be re-scored",
                                spec=spec.name)
    present = {path: text for path, text in files.items() if text is not None}  # None: left out, as the judge did
    return await rescore_bugfix(seed, present, spec, limits=AGENT_LIMITS, isolation=isolation, task=task)


def _read_regular(workdir: Path, relative: str) -> bytes | None:
    """The bytes of ``workdir / relative`` if it is a regular file of at most `MAX_SOURCE_BYTES`
    reached inside ``workdir`` (its last component never a link, its dirs never leading out of
    the work dir: a link to the pristine cache must not pass for the agent's file), else None."""
    root = workdir.resolve()
    path = root / relative
    try:
        if not path.parent.resolve().is_relative_to(root):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= MAX_SOURCE_BYTES else None


__all__ = ["AGENT_LIMITS", "PackageTestsSpec", "RealBugFixEnv", "read_sources", "rescore_episode", "task_for"]
