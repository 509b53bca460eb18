"""Issue 47 §B: every hidden-test case of one submission runs in a sandbox of its own (its own uid,
work dir and process cgroup), so judged code that forks until refused cannot make the other cases
fail to start, which used to end the episode as `JudgeUnavailable` (masked out of the loss: a wrong
fix escaped its zero). Runs on every backend here, as tests/envs/test_adversarial_judge.py does.
"""

from __future__ import annotations

import textwrap

import attrs
import pytest

from arl.envs.bugfix import JudgeUnavailable, generate_task
from arl.envs.bugfix import judge as judge_module
from arl.sandbox.sandbox import bwrap_problem
from tests.envs.backend_params import CONTAINERS

pytestmark = pytest.mark.anyio
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unavailable: {bwrap_problem()}")
MODES = ["none", pytest.param("bwrap", marks=needs_bwrap), *CONTAINERS]

# Appended to the buggy module: on import (in every case), fork until the kernel refuses, the
# children holding their processes until their case ends; every function then takes 0-4 s by its
# arguments, so cases end one by one and the cases started in their place find the process table
# (the shared uid's and cgroup's) full.
BOMB = textwrap.dedent("""
    import os as _os, time as _time
    while True:
        try:
            _pid = _os.fork()
        except OSError:
            break
        if _pid == 0:
            _time.sleep(30)
            _os._exit(0)

    def _slow(_f):
        def _g(*args):
            _time.sleep(len(repr(args)) % 5)
            return _f(*args)
        return _g

    for _name, _f in list(globals().items()):
        if callable(_f) and getattr(_f, "__module__", None) == __name__ and not _name.startswith("_"):
            globals()[_name] = _slow(_f)
""")


@pytest.mark.parametrize("isolation", MODES)
async def test_judged_code_that_forks_until_refused_keeps_its_zero(tmp_path, isolation):
    """All cases of the buggy module run (no `JudgeUnavailable`: a wrong fix must not escape its
    zero through the mask) and none passes that did not pass untouched."""
    task = generate_task(3)
    # more cases than run at once, so that some start while the first ones hold their children
    cases = (*task.cases, *(attrs.evolve(case, name=f"{case.name}_again") for case in task.cases))
    task = attrs.evolve(task, cases=cases, test_names=tuple(case.name for case in cases))
    limits = attrs.evolve(judge_module.CASE_LIMITS, max_procs=24, wall_s=20.0)
    (tmp_path / task.filename).write_text(task.source)
    untouched = await judge_module.judge(task, tmp_path, isolation=isolation, case_limits=limits, concurrency=12)
    (tmp_path / task.filename).write_text(task.source + BOMB)
    verdict = await judge_module.judge(task, tmp_path, isolation=isolation, case_limits=limits, concurrency=12)
    assert verdict.total == len(task.cases) and verdict.passed <= untouched.passed
    assert verdict.score < 1.0


async def test_a_case_that_did_not_start_is_run_again_alone(tmp_path, monkeypatch):
    """The first try of a case fails to start (as a neighbour's fork bomb made it): the judge runs
    it again, alone, before it calls itself unavailable; a case that never starts is still an error."""
    task = generate_task(3)
    (tmp_path / task.filename).write_text(task.fixed_source)
    real = judge_module.open_sandbox
    tries: list[str] = []

    def flaky(*args, **kwargs):
        sandbox = real(*args, **kwargs)
        tries.append("try")
        if len(tries) == 2:  # the second sandbox's runner cannot start the interpreter
            run = sandbox.run
            sandbox.run = lambda command, **kw: run("exit 1", **kw)
        return sandbox

    monkeypatch.setattr(judge_module, "open_sandbox", flaky)
    verdict = await judge_module.judge(task, tmp_path, isolation="none", concurrency=1)
    assert verdict.score == 1.0 and len(tries) == len(task.cases) + 1

    def broken(*args, **kwargs):
        sandbox = real(*args, **kwargs)
        run = sandbox.run
        sandbox.run = lambda command, **kw: run("exit 1", **kw)
        return sandbox

    monkeypatch.setattr(judge_module, "open_sandbox", broken)
    with pytest.raises(JudgeUnavailable, match="alone on a second try"):
        await judge_module.judge(task, tmp_path, isolation="none", concurrency=4)
