"""arl/RealBugFix-v0: real packages' sdists, bugs their own tests catch, the known fix scoring 1.

The pinned sdists are fetched from PyPI on first use (as `make test` does on a fresh clone) into
``$ARL_HOME/realbugs``. The fast tests check the task list against the pristine sources and one
task's verification; the slow ones re-verify every task and play episodes (the whole suite of a
package per episode).
"""

from __future__ import annotations

import collections

import gymnasium as gym
import pytest

import arl  # noqa: F401 -- registers the arl/ ids
from arl.envs.bugfix.solver import assistant_message
from arl.envs.realbugs.build import check_task, task_record
from arl.envs.realbugs.env import task_for
from arl.envs.realbugs.packages import PACKAGES, ensure_package
from arl.envs.realbugs.solver import realbug_calls
from arl.envs.realbugs.suite import parse_report
from arl.envs.realbugs.tasks import TASKS, candidates


def test_task_list_spans_packages_and_matches_the_pinned_sources():
    assert len(TASKS) >= 50
    per_package = collections.Counter(task.package for task in TASKS)
    assert len(per_package) >= 3, per_package
    assert len({task.name for task in TASKS}) == len(TASKS)
    for task in TASKS:
        pristine = (ensure_package(PACKAGES[task.package]) / task.path).read_text()
        buggy = task.apply(pristine)
        assert buggy != pristine and buggy.count(task.buggy) == 1  # the fix is one unambiguous str_replace
        assert buggy.replace(task.buggy, task.original, 1) == pristine  # the oracle: the pristine file
        # every task is one of the deterministic candidates of its file
        assert task in candidates(task.package, task.path, pristine)


def test_apply_refuses_a_changed_line():
    task = TASKS[0]
    with pytest.raises(ValueError, match="the line is not"):
        task.apply("something else\n" * (task.line + 1))


def test_report_counts_failures_errors_and_skips():
    result = parse_report('<testsuites><testsuite><testcase classname="t" name="a"/>'
                          '<testcase classname="t" name="b"><error message="E">tb</error></testcase>'
                          '<testcase classname="t" name="c"><skipped/></testcase></testsuite></testsuites>')
    assert (result.passed, result.failed, result.skipped, result.first_failure) == (1, 1, 1, "t::b")
    assert result.score(["t::a", "t::b", "t::c", "t::d"]) == 0.25


def test_a_changed_judge_verifies_again(monkeypatch, tmp_path):
    """A task's verification record is cached by what decides its verdict, the judge too: one an
    older judge made (keyed by the task and its sdist alone, as before JUDGE_VERSION) is not read,
    and a bumped JUDGE_VERSION checks the task again instead of reading the last judge's record."""
    import hashlib
    import json

    import attrs

    from arl.envs.realbugs import build, suite

    monkeypatch.setenv("ARL_HOME", str(tmp_path))
    task = TASKS[0]
    checks = []

    async def check(bug, isolation):
        checks.append(suite.JUDGE_VERSION)
        return {"caught": True, "status": "ok", "first_failure": f"judge {suite.JUDGE_VERSION}", "failure_text": ""}

    monkeypatch.setattr(build, "check_task", check)
    stale_key = [attrs.asdict(task), PACKAGES[task.package].sha256]  # what an older judge's record was named by
    digest = hashlib.sha256(json.dumps(stale_key, sort_keys=True).encode()).hexdigest()[:16]
    (tmp_path / "realbugs" / "verified").mkdir(parents=True)
    (tmp_path / "realbugs" / "verified" / f"stale-{digest}.json").write_text(
        json.dumps({"caught": False, "status": "ok", "first_failure": "old judge", "failure_text": ""}))
    first = task_record(task)
    assert first["first_failure"] == f"judge {suite.JUDGE_VERSION}" and len(checks) == 1
    assert task_record(task) == first and len(checks) == 1  # cached for the same judge
    monkeypatch.setattr(suite, "JUDGE_VERSION", suite.JUDGE_VERSION + 1)
    again = task_record(task)
    assert again["first_failure"] == f"judge {suite.JUDGE_VERSION}" and len(checks) == 2


@pytest.mark.parametrize("seed", [1])
def test_one_task_is_caught_by_its_package_tests(seed):
    """A sample of the build's verification, run afresh (not from the cache)."""
    import asyncio

    task = task_for(seed)
    row = asyncio.run(check_task(task, None))
    assert row["caught"] and row["first_failure"], row


@pytest.mark.slow
def test_every_task_verifies():
    """All of them (each a pytest -x run of its package in a sandbox, 3-60 s; cached after the first
    time, then under a second; from an empty cache ~30 min on 2 cores busy with other work)."""
    missed = [task.name for task in TASKS if not task_record(task)["caught"]]
    assert not missed


def _play(env, calls):
    reward, info = 0.0, {}
    for i, (name, arguments) in enumerate(calls):
        _, reward, terminated, truncated, info = env.step(assistant_message(name, arguments, f"call_{i}"))
        if terminated or truncated:
            break
    return reward, info


@pytest.mark.slow
def test_known_fix_scores_one_and_the_bug_less():
    seed = next(i for i, task in enumerate(TASKS) if task.package == "inflection")  # the quickest suite
    env = gym.make("arl/RealBugFix-v0").unwrapped
    try:
        observation, _ = env.reset(seed=seed)
        assert "fails" in observation and env.record["first_failure"] in observation
        reward, info = _play(env, realbug_calls(task_for(seed)))
        assert reward == 1.0 and info["success"], info
        env.reset(seed=seed)
        reward, info = _play(env, [("submit", {})])
        assert 0.0 <= reward < 1.0 and not info["success"]
    finally:
        env.close()


def test_oracle_plays_the_known_fix_in_proxy_mode_only():
    from arl.config import load_config
    from arl.rollout.oracle import REALBUGS_ENV, OracleClient, check_oracle

    rollout = load_config("tiny_realbugs_proxy").rollout
    assert rollout.env_id == REALBUGS_ENV
    check_oracle(rollout)  # a tool-calling proxy agent: accepted
    assert OracleClient(5, REALBUGS_ENV).calls == realbug_calls(task_for(5))
    rollout.mode = "step"
    with pytest.raises(ValueError, match="tool-calling agent"):
        check_oracle(rollout)


def test_arl_eval_rescore_scores_stored_realbugfix_episodes_from_their_files(capsys, tmp_path):
    """`arl eval tiny_realbugs_proxy --oracle --out DIR` stores each episode's final package
    sources (only `Package.sources`, what the judge reads); `arl eval --rescore DIR` scores them
    again, no agent, no model: the row whose files are put back to the bug loses its 1.0."""
    from arl.cli import main
    from arl.rollout import evaluate as ev

    out = tmp_path / "eval"
    assert main(["eval", "tiny_realbugs_proxy", "--oracle", "--seeds", "9:11", "--out", str(out)]) == 0
    rows = ev.read_rows(out / ev.RESULTS_FILE)
    assert len(rows) == 2 and all(r["score"] == 1.0 and r["success"] for r in rows), rows
    for row in rows:
        task = task_for(row["seed"])
        assert set(row["final_files"]) == set(PACKAGES[task.package].sources)
    task = task_for(rows[0]["seed"])
    pristine = (ensure_package(PACKAGES[task.package]) / task.path).read_text()
    rows[0] = {**rows[0], "final_files": {**rows[0]["final_files"], task.path: task.apply(pristine)}}
    (out / ev.RESULTS_FILE).write_text("".join(ev.json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(["eval", "--rescore", str(out)]) == 0
    assert "rescored 2 rollouts from the files their episodes ended with, 1 changed" in capsys.readouterr().out
    rescored = {r["seed"]: r for r in ev.read_rows(out / ev.RESCORED_FILE)}
    assert 0 < rescored[9]["score"] < 1 and not rescored[9]["success"]
    assert rescored[10]["score"] == 1.0 and rescored[10]["success"]
    # the sharper signal beside the score: the share of the tests the bug breaks that pass
    assert all(r["reward_extra"]["tests_broken_passed"] == 1.0 for r in rows)
    assert rescored[9]["reward_extra"]["tests_broken_passed"] == 0.0 and rescored[9]["reward_extra"]["tests_broken"] > 0
    summary = ev.json.loads((out / ev.RESCORED_SUMMARY_FILE).read_text())
    assert summary["metrics"]["eval/reward/tests_broken_passed"] == 0.5


def test_broken_tests_pass_share_separates_fixed_from_unfixed():
    """The reward of an unfixed submission is ~0.996 here (2 of 455 tests fail), the fix's 1.0;
    ``tests_broken_passed`` (`PackageTestsSpec`'s extra) is 0 against 1."""
    import asyncio

    from arl.envs.realbugs.env import PackageTestsSpec

    task = task_for(9)
    pristine = (ensure_package(PACKAGES[task.package]) / task.path).read_text()
    spec = PackageTestsSpec()
    unfixed = asyncio.run(spec.score_sources({task.path: task.apply(pristine).encode()}, task, None))
    fixed = asyncio.run(spec.score_sources({task.path: pristine.encode()}, task, None))
    assert 0.99 < unfixed.score < 1.0 and not unfixed.success and unfixed.total == fixed.total == unfixed.passed + 2
    assert unfixed.metrics == {"tests_broken": 2.0, "tests_broken_passed": 0.0}
    assert fixed.score == 1.0 and fixed.success and fixed.metrics == {"tests_broken": 2.0, "tests_broken_passed": 1.0}


def test_every_tasks_oracle_scores_one_under_the_judge():
    """Every task's known fix gives its file back byte for byte (so its oracle is the pristine
    package), and the judge scores each pristine package 1.0, every pristine test id passing:
    the oracle of all 80 tasks, one suite run per package."""
    import asyncio

    from arl.envs.realbugs.env import PackageTestsSpec

    for name, package in PACKAGES.items():
        tasks = [task for task in TASKS if task.package == name]
        sources = {path: (ensure_package(package) / path).read_bytes() for path in package.sources}
        for task in tasks:
            buggy = task.apply(sources[task.path].decode())
            assert buggy.replace(*task.fix, 1).encode() == sources[task.path], task.name
        result = asyncio.run(PackageTestsSpec().score_sources(sources, tasks[0], None))
        assert result.score == 1.0 and result.success and result.total > 100, (name, result.extra)


def test_a_stored_episode_without_its_package_sources_is_not_rescored_as_pristine():
    """Rows stored before RealBugFix kept its package's sources hold only top-level files: the
    judge would take the pristine module for the missing one, so re-scoring refuses them (an
    env_error row in `arl eval --rescore`, never a 1.0)."""
    import asyncio

    from arl.envs.realbugs.env import rescore_episode
    from arl.envs.reward_spec import RewardUnavailable

    with pytest.raises(RewardUnavailable, match="holds no final copy of inflection/__init__.py"):
        asyncio.run(rescore_episode(9, {"setup.py": "", "test_inflection.py": ""}))
