"""Build ``arl/RealBugFix-v0``'s cache: fetch the pinned sdists once, verify every task.

    python -m arl.envs.realbugs.build            # fetch (pip download, sha256-checked), verify TASKS, cache
    python -m arl.envs.realbugs.build --select   # the maintainers' step: re-pick TASKS from the candidates

Verification (each record cached in ``$ARL_HOME/realbugs/verified/``, named by what it checked
and by the judge that checked it, `arl.envs.realbugs.suite.judge_key`, so a changed judge verifies again;
an env reset verifies a task it finds unchecked, in seconds, so the build is a warm-up): each
package's pristine suite passes in full in the sandbox (the ids of its tests are the reward's
denominator), and each task's buggy file fails at least one test (pytest ``-x``: the first
failing test and its message are what the agent is shown). The oracle of a task is the pristine
file (`RealBug.apply` replaces one line; the fix puts it back byte for byte), so one full run per
package checks every task's oracle. A task that no longer verifies is an error of the build, not
a task silently dropped: `TASKS` is checked-in data.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import hashlib
import itertools
import json
import os
import sys
from typing import Any

import attrs

from arl.envs.realbugs.packages import PACKAGES, cache_dir, ensure_package
from arl.envs.realbugs.suite import SUITE_LIMITS, judge_key, run_suite
from arl.envs.realbugs.tasks import STRIDES, TASKS, TASKS_FILE, RealBug, candidates

CHECK_LIMITS = attrs.evolve(SUITE_LIMITS, wall_s=60.0)


def _cached(name: str, key: Any, make: Any) -> dict[str, Any]:
    """The record ``make()`` gave for ``key`` and the judge (`judge_key`), cached under
    ``$ARL_HOME/realbugs/verified``: one an older judge made is never read."""
    digest = hashlib.sha256(json.dumps([key, judge_key()], sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "verified" / f"{name}-{digest}.json"
    for done in sorted(path.parent.glob(f"*-{digest}.json")):  # the digest names the check; the name is for people
        return json.loads(done.read_text())
    record = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")  # episodes checking the same task at once
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)
    return record


def package_record(name: str, isolation: str | None = None) -> dict[str, Any]:
    """``{"tests": n, "skipped": k, "ids": [...]}`` of ``name``'s pristine suite (run once, then
    cached): ``ids`` are the tests that pass, the reward's denominator (`SuiteResult.score`)."""
    package = PACKAGES[name]
    return _cached(package.dirname, [package.sha256, "ids"], lambda: _run(check_package(name, isolation)))


def task_record(task: RealBug, isolation: str | None = None) -> dict[str, Any]:
    """``task``'s check (`check_task`; run once, then cached): ``caught``, ``first_failure``, ..."""
    return _cached(task.name.replace("/", "_").replace(":", "_"), [attrs.asdict(task), PACKAGES[task.package].sha256],
                   lambda: _run(check_task(task, isolation)))


def broken_record(task: RealBug, isolation: str | None = None) -> dict[str, Any]:
    """``{"broken": [ids], "status": ...}``: the pristine suite's tests that do not pass with
    ``task``'s bug in (a full run, not ``-x``; run once, then cached). All of them where the bug
    breaks the import or the run (a mutant that hangs: ``status`` ``timeout``). The denominator of
    the ``tests_broken_passed`` metric (`arl.envs.realbugs.env.PackageTestsSpec`)."""
    return _cached(task.name.replace("/", "_").replace(":", "_") + "-broken",
                   [attrs.asdict(task), PACKAGES[task.package].sha256, "broken"],
                   lambda: _run(check_broken(task, isolation)))


async def _gather(*coroutines: Any) -> list[Any]:
    return list(await asyncio.gather(*coroutines))


def _run(coroutine: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # inside a loop (an env's reset): a loop of our own
        return pool.submit(asyncio.run, coroutine).result()


async def check_package(name: str, isolation: str | None) -> dict[str, Any]:
    result = await run_suite(PACKAGES[name], isolation=isolation)
    if result.status != "ok" or result.failed or not result.passed:
        raise RuntimeError(f"{name}'s pristine suite does not pass in the sandbox: {result}")
    return {"tests": result.passed, "skipped": result.skipped, "ids": sorted(result.passed_ids)}


async def check_task(task: RealBug, isolation: str | None) -> dict[str, Any]:
    package = PACKAGES[task.package]
    pristine = (ensure_package(package) / task.path).read_text()
    buggy = task.apply(pristine)
    if buggy.replace(task.buggy, task.original, 1) != pristine or buggy.count(task.buggy) != 1:
        raise RuntimeError(f"{task.name}: its fix does not give the pristine file back")
    result = await run_suite(package, {task.path: buggy.encode()}, isolation=isolation, stop_first=True,
                             limits=CHECK_LIMITS)  # a mutant that hangs is dropped after a minute
    return {"caught": result.failed > 0 and result.status == "ok", "status": result.status,
            "first_failure": result.first_failure, "failure_text": result.failure_text[-3000:]}


async def check_broken(task: RealBug, isolation: str | None) -> dict[str, Any]:
    package = PACKAGES[task.package]
    buggy = task.apply((ensure_package(package) / task.path).read_text())
    expected = (await asyncio.to_thread(package_record, task.package, isolation))["ids"]
    result = await run_suite(package, {task.path: buggy.encode()}, isolation=isolation, limits=CHECK_LIMITS)
    return {"broken": [name for name, ok in result.verdicts(expected).items() if not ok], "status": result.status}


def build(isolation: str | None = None, *, select: bool = False, limit: int | None = None, jobs: int = 1,
          log: Any = None) -> dict[str, Any]:
    """Fetch the sdists, check every package and every task (cached); with ``select``, re-pick
    the task list from the first ``limit`` candidates (all: None) and write it (``tasks.json``)
    as it goes. ``jobs``: checks run at once (each a sandboxed pytest run)."""
    say = log or (lambda text: None)
    packages = {}
    for name, package in PACKAGES.items():
        ensure_package(package)
        packages[name] = package_record(name, isolation)
        say(f"{name}: pristine suite {packages[name]['tests']} passed")
    tasks = TASKS
    if select:  # the packages' candidates interleaved, so a build stopped early still spans them all
        lists = [candidates(name, path, (ensure_package(package) / path).read_text())[::STRIDES[name]]
                 for name, package in PACKAGES.items() for path in package.sources]
        tasks = tuple(bug for row in itertools.zip_longest(*lists) for bug in row if bug is not None)[:limit]
    results: dict[str, Any] = {}
    gate = asyncio.Semaphore(max(1, jobs))

    async def one(task: RealBug) -> None:
        async with gate:
            row = await asyncio.to_thread(task_record, task, isolation)
        results[task.name] = row
        say(f"[{len(results)}/{len(tasks)}] {task.name} {task.kind}: "
            f"{'caught by ' + str(row['first_failure']) if row['caught'] else 'NOT caught'}")
        if select:  # kept as it goes: the list so far is usable if the build is stopped
            _write([t for t in tasks if t.name in results and results[t.name]["caught"]], limit)

    _run(_gather(*(one(task) for task in tasks)))
    if not select and (missed := [name for name, row in results.items() if not row["caught"]]):
        raise RuntimeError(f"tasks no longer caught by their package's tests: {missed}")
    return {"packages": packages, "tasks": {name: row for name, row in results.items() if row["caught"]}}


def _write(kept: list[RealBug], limit: int | None) -> None:
    TASKS_FILE.write_text(json.dumps({"strides": STRIDES, "limit": limit, "tasks": [attrs.asdict(t) for t in kept]}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arl.envs.realbugs.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--isolation", default=None, help="sandbox backend (default: the configured one)")
    parser.add_argument("--select", action="store_true", help="re-pick the task list (rewrites tasks.json)")
    parser.add_argument("--jobs", type=int, default=1, help="checks at once (default 1)")
    parser.add_argument("--limit", type=int, default=None, help="with --select: the first N candidates only")
    args = parser.parse_args(argv)
    record = build(args.isolation, select=args.select, limit=args.limit, jobs=args.jobs, log=lambda text: print(text, flush=True))
    print(f"{len(record['tasks'])} tasks verified over {len(record['packages'])} packages -> {cache_dir() / 'verified'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["broken_record", "build", "check_broken", "check_package", "check_task", "main", "package_record",
           "task_record"]
