"""Generated bug-fix tasks: deterministic, and every one is solvable and failed when untouched.

The solvability check judges every case with the host's comparison (`judge.passes`, on the
runner's encoding) once on the module as shipped and once with the scripted solver's fix, for seeds
0..49 (ARL_BUGFIX_SEEDS=N for more); the real judge (each case a sandboxed runner) does the same
for a few of them.
"""

from __future__ import annotations

import collections
import json
import os

import pytest

from arl.envs.bugfix import run_tests
from arl.envs.bugfix.judge import judge, passes
from arl.envs.bugfix.tasks import FAMILIES, generate_task
from arl.sandbox.sandbox import Sandbox, SandboxLimits

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


def _outcome(namespace, case):
    """What the runner would report for ``case``, computed in-process (our own generated code)."""
    args = run_tests.decode(json.loads(json.dumps(run_tests.encode(case.args))))
    try:
        value = namespace[case.function](*args)
    except Exception as exc:  # noqa: BLE001 -- a mutant's crash is an outcome
        return "raises", type(exc).__name__
    return "value", run_tests.decode(json.loads(json.dumps(run_tests.encode(value))))


def test_every_task_fails_untouched_and_passes_fixed():
    for seed in range(N_SEEDS):
        task = generate_task(seed)
        assert tuple(c.name for c in task.cases) == task.test_names
        for variant, source in (("buggy", task.source), ("fixed", task.fixed_source)):
            namespace: dict = {}
            exec(compile(source, task.filename, "exec"), namespace)  # noqa: S102 -- generated code
            passed = {c.name for c in task.cases if passes(c, _outcome(namespace, c))}
            if variant == "fixed":
                assert passed == set(task.test_names), (seed, task.issue)
            else:
                assert len(passed) < len(task.test_names), (seed, task.issue)


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_the_sandboxed_judge_agrees(seed, tmp_path):
    task = generate_task(seed)
    scores = {}
    for variant, source in (("buggy", task.source), ("fixed", task.fixed_source)):
        (tmp_path / variant).mkdir()
        (tmp_path / variant / task.filename).write_text(source)
        scores[variant] = (await judge(task, tmp_path / variant)).score
    assert scores["fixed"] == 1.0 > scores["buggy"], (seed, scores)


async def test_pytest_agrees_with_the_runner(tmp_path):
    """The hidden tests are plain pytest tests: pytest finds the failures the judge finds."""
    task = generate_task(5)
    (tmp_path / task.filename).write_text(task.source)
    verdict = await judge(task, tmp_path)
    failed_by_judge = set(task.test_names) - verdict.passed
    assert failed_by_judge
    async with Sandbox(SandboxLimits(wall_s=60.0, cpu_s=60.0), python=True) as sb:
        sb.write_file(f"tests/{task.test_filename}", task.tests)
        sb.write_file(f"src/{task.filename}", task.source)
        pytest_run = await sb.run(f"PYTHONPATH=src python -m pytest -q -p no:cacheprovider tests/{task.test_filename}")
    assert pytest_run.exit_code == 1
    assert f"{len(failed_by_judge)} failed, {len(task.test_names) - len(failed_by_judge)} passed" in pytest_run.stdout
    assert all(f"::{name} " in pytest_run.stdout or name in pytest_run.stdout for name in failed_by_judge)
