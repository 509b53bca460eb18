"""Generated bug-fix tasks: deterministic, and every one is solvable and failed when untouched.

The solvability check runs the real hidden-test runner inside the sandbox, once on the module as
shipped and once with the scripted solver's fix, for seeds 0..49 (ARL_BUGFIX_SEEDS=N for more).
"""

from __future__ import annotations

import collections
import json
import os

import pytest

from arl.envs.bugfix.env import RUNNER
from arl.envs.bugfix.tasks import FAMILIES, generate_task
from arl.envs.sandbox import Sandbox, SandboxLimits

pytestmark = pytest.mark.anyio

N_SEEDS = int(os.environ.get("ARL_BUGFIX_SEEDS", "50"))


def test_deterministic_and_varied():
    tasks = [generate_task(s) for s in range(200)]
    fresh = generate_task.__wrapped__(17)  # bypass the cache: generation itself is deterministic
    assert fresh == tasks[17]
    assert len({t.source for t in tasks}) == 200
    assert len({t.bug_kind for t in tasks}) >= 5
    targets = collections.Counter(next(k for k, f in FAMILIES.items() if any(
        f"def {n}(" in t.fixed_source and t.function == n for n in f.names)) for t in tasks)
    assert len(targets) == len(FAMILIES)  # every family is a target for some seed
    for t in tasks:
        buggy, fixed = t.fix
        assert t.source.count(buggy) == 1 and t.source.replace(buggy, fixed) == t.fixed_source
        assert t.issue.startswith(f"In {t.filename}, `{t.function}(") and "\n" not in t.issue
        assert len(t.test_names) == len(set(t.test_names)) == t.tests.count("\ndef test_")


async def test_every_task_fails_untouched_and_passes_fixed():
    seeds = range(N_SEEDS)
    budget = 60.0 + N_SEEDS  # seconds: ~30 ms a run on an idle machine, far more on a loaded one
    async with Sandbox(SandboxLimits(wall_s=budget, cpu_s=budget, output_bytes=1 << 24), python=True) as sb:
        sb.write_file("run_tests.py", RUNNER.read_text())
        for seed in seeds:
            task = generate_task(seed)
            sb.write_file(f"t{seed}/{task.test_filename}", task.tests)
            sb.write_file(f"t{seed}/buggy/{task.filename}", task.source)
            sb.write_file(f"t{seed}/fixed/{task.filename}", task.fixed_source)
        loop = (f"for s in {' '.join(map(str, seeds))}; do for v in buggy fixed; do "
                f"t=$(ls t$s/test_*.py); echo $s:$v | python -I -S -B run_tests.py $t {sb.cwd}/t$s/$v; done; done")
        result = await sb.run(loop)
    assert result.ok, result.stderr[-2000:]
    passed: dict[tuple[int, str], set[str]] = collections.defaultdict(set)
    ran: dict[tuple[int, str], int] = collections.Counter()
    for line in result.stdout.splitlines():
        tag, _, payload = line.partition(" ")
        seed, variant = tag.split(":")
        name, ok, _detail = json.loads(payload)
        ran[int(seed), variant] += 1
        if ok:
            passed[int(seed), variant].add(name)
    for seed in seeds:
        task = generate_task(seed)
        assert ran[seed, "buggy"] == ran[seed, "fixed"] == len(task.test_names), seed
        assert passed[seed, "fixed"] == set(task.test_names), (seed, task.issue)
        assert len(passed[seed, "buggy"]) < len(task.test_names), (seed, task.issue)


async def test_pytest_agrees_with_the_runner():
    """The hidden tests are plain pytest tests: pytest finds the same failures."""
    task = generate_task(5)
    async with Sandbox(SandboxLimits(wall_s=60.0, cpu_s=60.0), python=True) as sb:
        sb.write_file(f"tests/{task.test_filename}", task.tests)
        sb.write_file(f"src/{task.filename}", task.source)
        sb.write_file("run_tests.py", RUNNER.read_text())
        pytest_run = await sb.run(f"PYTHONPATH=src python -m pytest -q -p no:cacheprovider tests/{task.test_filename}")
        runner = await sb.run(f"echo N | python -I -S -B run_tests.py tests/{task.test_filename} {sb.cwd}/src")
    failed_by_runner = {json.loads(line[2:])[0] for line in runner.stdout.splitlines() if not json.loads(line[2:])[1]}
    assert failed_by_runner
    assert pytest_run.exit_code == 1
    assert f"{len(failed_by_runner)} failed, {len(task.test_names) - len(failed_by_runner)} passed" in pytest_run.stdout
