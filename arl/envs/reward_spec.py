"""Reward specifications: how a benchmark scores the live sandbox once the agent has stopped.

    class MySpec(RewardSpec):
        name, timeout_s = "my-tests", 600.0
        async def score(self, sandbox, task) -> RewardResult:
            result = await sandbox.exec(["python", "-m", "pytest", "-q"], timeout=self.timeout_s)
            ...
            return RewardResult(score=passed / total, tests={"test_a": True, ...}, extra={"pytest_s": ...})

    episode = ScoredSandbox(open_sandbox(...), MySpec(), task)
    await episode.start()                     # 1. start
    ...                                       # 2. the agent's commands: episode.sandbox.exec / run
    result = await episode.finish()           # 3. reward (run_reward), then 4. stop, always

A benchmark implements `RewardSpec.score`; arl owns the order start -> agent -> reward -> stop
(`ScoredSandbox`, the one place that knows it; `arl.envs.bugfix.env.BugFixEnv` plays its episodes
through it) and the faults around the spec (`run_reward`):

- **Its own timeout.** ``score`` runs under ``asyncio.wait_for(..., spec.timeout_s)`` (test suites
  of SWE tasks take 300-1800 s). A spec past it is cancelled and raises `RewardTimeout`.
- **Never a silent 0.** A spec that cannot decide raises a `RewardError`, a class per cause:
  `RewardTimeout` (past ``timeout_s``), `RewardSandboxDied` (the sandbox was gone before or during
  scoring: `arl.sandbox.sandbox.SandboxDied`), `RewardUnavailable` (its runner or its sandbox
  backend cannot start here: `arl.sandbox.sandbox.SandboxUnavailable`), `RewardCrashed` (the spec
  itself raised, or returned something that is not a `RewardResult` with a finite score). The env
  lets it through its ``step``; the agent runner ends the episode with exit reason ``env_error``
  and the error text ``"<ClassName>: <what to do>"`` (so `arl eval` counts it under that class
  name, `arl.rollout.evaluate.error_type`), and the trainer masks it out of the loss when
  ``rollout.mask_abnormal`` (the default). The message says what to do about it.
- **It does not block.** ``score`` is a coroutine: sandbox commands are awaited (``Sandbox.exec``
  is a subprocess), so a test suite that runs for minutes leaves the event loop to every other
  episode. A spec with blocking host-side work puts it in ``asyncio.to_thread``.
- **The sandbox is stopped whatever happens** (`ScoredSandbox.finish` and ``abort``: shielded
  `arl.sandbox.sandbox.Sandbox.stop`), also when the reward fails or the caller is cancelled.

Re-scoring (`rescore_files`): a spec that reads only the work dir's files scores a stored episode
(its final files) again in a fresh sandbox, without replaying the agent.
"""

from __future__ import annotations

import abc
import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import attrs

from arl.sandbox.sandbox import Sandbox, SandboxDied, SandboxUnavailable

T = TypeVar("T")


@attrs.frozen
class RewardResult:
    """What a spec decided: ``score`` (the episode's reward), ``tests`` (pass/fail per test, by
    name; empty when the benchmark has no named tests) and ``extra`` (numbers or short strings
    for the metrics, e.g. the test run's seconds).

    >>> r = RewardResult(0.5, {"a": True, "b": False})
    >>> (r.passed, r.total, r.success)
    (1, 2, False)
    """

    score: float
    tests: Mapping[str, bool] = attrs.field(factory=dict)
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def passed(self) -> int:
        return sum(bool(v) for v in self.tests.values())

    @property
    def total(self) -> int:
        return len(self.tests)

    @property
    def metrics(self) -> dict[str, float]:
        """The numbers of ``extra`` (not bools, not strings or containers): what an env reports
        as its last step's ``info["reward_extra"]`` and the rollout and eval metrics average
        (``rollout/reward/<name>``, ``eval/reward/<name>``).

        >>> RewardResult(0.5, extra={"tests_broken_passed": 0.0, "status": "ok", "flag": True}).metrics
        {'tests_broken_passed': 0.0}
        """
        return {str(k): float(v) for k, v in self.extra.items()
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}

    @property
    def success(self) -> bool:
        """Every test passes (a spec without tests: a score of at least 1)."""
        return self.passed == self.total if self.tests else self.score >= 1.0


class RewardError(RuntimeError):
    """The spec could not decide a reward (not the agent's fault): the episode has none.
    ``spec``: the spec's name."""

    def __init__(self, message: str, *, spec: str = "") -> None:
        super().__init__(message)
        self.spec = spec


class RewardTimeout(RewardError):
    """The spec ran past its ``timeout_s``."""


class RewardSandboxDied(RewardError):
    """The sandbox the spec was to score was gone (closed, its container removed or killed)."""


class RewardUnavailable(RewardError):
    """The spec's runner or sandbox backend cannot start here (a missing container runtime, no
    interpreter, a host too loaded to start a process)."""


class RewardCrashed(RewardError):
    """The spec itself raised, or returned no `RewardResult` with a finite score: a bug in the spec."""


class RewardSpec(abc.ABC):
    """A benchmark's reward: ``score`` the live sandbox (its work dir as the agent left it) for
    ``task`` (whatever the benchmark's env hands over: its task record). Subclasses set ``name``
    (in error messages and metrics) and ``timeout_s`` (the whole of ``score``, `run_reward`)."""

    name: str = "reward"
    timeout_s: float = 300.0

    @abc.abstractmethod
    async def score(self, sandbox: Sandbox, task: Any) -> RewardResult:
        """The reward for ``task`` as ``sandbox`` is now. Raise a `RewardError` subclass (or let
        `SandboxDied` / `SandboxUnavailable` through) when it cannot be decided; never return 0 for it."""


async def run_reward(spec: RewardSpec, sandbox: Sandbox, task: Any, *, timeout_s: float | None = None) -> RewardResult:
    """``spec.score(sandbox, task)`` under its timeout (``timeout_s`` overrides ``spec.timeout_s``),
    each failure a `RewardError` subclass whose message says what to do (module docstring)."""
    limit = float(spec.timeout_s if timeout_s is None else timeout_s)
    name = spec.name
    if sandbox.closed or not await sandbox.alive():
        raise RewardSandboxDied(f"reward {name!r}: the sandbox {sandbox!r} was gone before scoring (killed, or its "
                                "container removed): the episode has no reward; check the host's OOM and container "
                                "logs, or raise the sandbox's memory limit", spec=name)
    try:
        result = await asyncio.wait_for(spec.score(sandbox, task), limit)
    except RewardError:
        raise
    except TimeoutError:
        raise RewardTimeout(f"reward {name!r} ran past its timeout of {limit:g} s and was stopped: raise the spec's "
                            "timeout_s, or give the host fewer concurrent episodes", spec=name) from None
    except SandboxDied as exc:
        raise RewardSandboxDied(f"reward {name!r}: the sandbox died while scoring ({exc}): the episode has no "
                                "reward; check the host's OOM and container logs", spec=name) from exc
    except SandboxUnavailable as exc:
        raise RewardUnavailable(f"reward {name!r}: its sandbox cannot start ({exc}): install that backend's "
                                "runtime or choose another with rollout.sandbox.backend", spec=name) from exc
    except Exception as exc:  # a bug in the spec: data, not a crash of the rollout
        raise RewardCrashed(f"reward {name!r} raised {type(exc).__name__}: {exc}", spec=name) from exc
    if not isinstance(result, RewardResult) or not math.isfinite(float(result.score)):
        raise RewardCrashed(f"reward {name!r} returned {result!r}, not a RewardResult with a finite score", spec=name)
    return result


class ScoredSandbox:
    """One episode's sandbox and its reward, in arl's order: `start`, the agent's commands (on
    ``sandbox``), `finish` (the reward, then stop), or `abort` (stop, no reward). Stopping is
    idempotent and happens on every path out of `finish`."""

    def __init__(self, sandbox: Sandbox, spec: RewardSpec, task: Any) -> None:
        self.sandbox = sandbox
        self.spec = spec
        self.task = task
        self.result: RewardResult | None = None

    async def start(self) -> Sandbox:
        return await self.sandbox.start()

    async def finish(self, *, timeout_s: float | None = None) -> RewardResult:
        """Score the live sandbox (`run_reward`), then stop it, whether scoring worked or not."""
        try:
            self.result = await run_reward(self.spec, self.sandbox, self.task, timeout_s=timeout_s)
            return self.result
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Stop the sandbox without scoring (shielded from cancellation: `Sandbox.stop`)."""
        if not self.sandbox.closed:
            await self.sandbox.stop()


async def run_scored_episode(sandbox: Sandbox, spec: RewardSpec, task: Any,
                             agent: Callable[[Sandbox], Awaitable[T]]) -> tuple[T, RewardResult]:
    """start -> ``agent(sandbox)`` -> reward -> stop, for an agent that is one coroutine. An agent
    that raises stops the sandbox unscored and its exception goes on."""
    episode = ScoredSandbox(sandbox, spec, task)
    try:
        await episode.start()
        outcome = await agent(episode.sandbox)
    except BaseException:
        await episode.abort()
        raise
    return outcome, await episode.finish()


async def rescore_files(spec: RewardSpec, task: Any, files: Mapping[str, str | bytes], sandbox: Sandbox) -> RewardResult:
    """Score a stored episode again: write ``files`` (work-dir-relative path -> content, the
    episode's final files) into the fresh ``sandbox``, then reward and stop as `ScoredSandbox` does."""
    episode = ScoredSandbox(sandbox, spec, task)
    try:
        await episode.start()
        for path, data in files.items():
            sandbox.write_file(path, data)
    except BaseException:
        await episode.abort()
        raise
    return await episode.finish()


__all__ = [
    "RewardCrashed", "RewardError", "RewardResult", "RewardSandboxDied", "RewardSpec", "RewardTimeout",
    "RewardUnavailable", "ScoredSandbox", "rescore_files", "run_reward", "run_scored_episode",
]
