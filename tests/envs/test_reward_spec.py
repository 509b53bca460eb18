"""Reward specifications (`arl.envs.reward_spec`) on the BugFix env: the judge as a spec, the
order start -> agent -> reward -> stop, each fault a typed error with a message that says what to
do (never a silent 0), a slow reward beside a progressing episode, oracle scores and re-scoring."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from arl.envs.bugfix import BugFixEnv, assistant_message, generate_task, solution_calls
from arl.envs.bugfix.env import rescore_episode
from arl.envs.bugfix.judge import CASE_LIMITS, HiddenTestsSpec, JudgeUnavailable
from arl.envs.reward_spec import (
    RewardCrashed,
    RewardError,
    RewardResult,
    RewardSandboxDied,
    RewardSpec,
    RewardTimeout,
    RewardUnavailable,
    ScoredSandbox,
    run_reward,
)
from arl.sandbox.backends import backend_problem, open_sandbox
from arl.sandbox.sandbox import SandboxDied, SandboxUnavailable
from tests.envs.backend_params import CONTAINERS

SEED = 3


class SleepSpec(RewardSpec):
    """A reward whose test run takes ``seconds`` inside the sandbox (``sleep``), then scores 0.25."""

    name = "sleepy"

    def __init__(self, seconds: float, timeout_s: float = 60.0) -> None:
        self.seconds, self.timeout_s = seconds, timeout_s
        self.finished_at: float | None = None

    async def score(self, sandbox, task) -> RewardResult:
        result = await sandbox.exec(["sleep", str(self.seconds)], timeout=self.seconds + 30)
        assert result.ok, result
        self.finished_at = time.monotonic()
        return RewardResult(0.25, {"t": False}, {"slept_s": self.seconds})


class RaisingSpec(RewardSpec):
    name = "buggy-spec"

    async def score(self, sandbox, task) -> RewardResult:
        raise KeyError("expected_output")


class NanSpec(RewardSpec):
    name = "nan-spec"

    async def score(self, sandbox, task) -> RewardResult:
        return RewardResult(math.nan)


def play(env: BugFixEnv, calls) -> tuple[float, dict]:
    reward, info = 0.0, {}
    for i, (name, arguments) in enumerate(calls):
        _, reward, terminated, truncated, info = env.step(assistant_message(name, arguments, f"c{i}"))
        if terminated or truncated:
            break
    return reward, info


def test_the_judge_is_a_spec_with_the_same_scores():
    task = generate_task(SEED)
    env = BugFixEnv()
    env.reset(seed=SEED)
    reward, info = play(env, solution_calls(task))
    assert reward == 1.0 and info["success"] and info["tests_passed"] == info["tests_total"] == len(task.cases)
    assert env.sandbox.closed  # stopped after the reward
    # the buggy code under the spec directly: the judge's fraction, a pass/fail per test
    sandbox = open_sandbox(python=True)
    sandbox.write_file(task.filename, task.source)
    result = asyncio.run(ScoredSandbox(sandbox, HiddenTestsSpec(), task).finish())
    assert sandbox.closed and 0 < result.score < 1 and result.total == len(task.cases)
    assert result.score == result.passed / result.total and result.extra["failed"]


def test_a_slow_reward_does_not_block_another_episode():
    """One episode's reward runs 3 s; another episode plays its whole fix meanwhile."""
    slow_spec = SleepSpec(3.0)
    slow, fast = BugFixEnv(reward_spec=slow_spec), BugFixEnv()
    slow.reset(seed=SEED)
    fast.reset(seed=SEED + 1)
    fast_steps: list[float] = []

    async def fast_episode():
        await asyncio.sleep(0.3)  # the slow reward is under way
        for i, (name, arguments) in enumerate(solution_calls(generate_task(SEED + 1))):
            _, reward, terminated, _, _ = await fast.astep(assistant_message(name, arguments, f"f{i}"))
            fast_steps.append(time.monotonic())
        return reward

    async def main():
        return await asyncio.gather(slow.astep(assistant_message("submit", {})), fast_episode())

    (_, slow_reward, *_), fast_reward = asyncio.run(main())
    assert slow_reward == 0.25 and fast_reward == 1.0
    assert len(fast_steps) == 3 and fast_steps[-1] < slow_spec.finished_at  # all three steps during the slow reward


def test_a_reward_past_its_timeout_is_an_error_not_a_zero():
    env = BugFixEnv(reward_spec=SleepSpec(30.0, timeout_s=0.5))
    env.reset(seed=SEED)
    start = time.monotonic()
    with pytest.raises(RewardTimeout, match=r"timeout of 0.5 s .* raise the spec's timeout_s"):
        env.step(assistant_message("submit", {}))
    assert time.monotonic() - start < 15
    assert env.sandbox.closed and env.done  # the sandbox stopped (its sleep killed) all the same


def test_the_runner_ends_a_failed_reward_as_a_masked_env_error():
    """Through the tool-calling runner: exit ``env_error``, the error text starting with the
    spec's error class, no reward."""
    from arl.agents.bugfix import BugFixRunner
    from arl.rollout.oracle import OracleClient

    runner = BugFixRunner(OracleClient(SEED), env_kwargs={"reward_spec": SleepSpec(30.0, timeout_s=0.5)})
    result = asyncio.run(runner.run_job(SEED))
    assert result.exit_reason == "env_error" and result.status == "Failed"
    assert result.error.startswith("arl.envs.reward_spec.RewardTimeout: reward 'sleepy' ran past its timeout")
    assert sum(result.step_scores) == 0.0


def test_a_sandbox_that_dies_mid_episode():
    env = BugFixEnv()
    env.reset(seed=SEED)
    env.step(assistant_message("bash", {"command": "true"}))
    env.sandbox.close_sync()  # killed under the agent (an OOM kill, a removed container)
    with pytest.raises(SandboxDied, match="died mid-episode.*OOM and container logs"):
        env.step(assistant_message("bash", {"command": "ls"}))
    # and under a reward: run_reward refuses a gone sandbox before scoring
    sandbox = open_sandbox(python=True)
    sandbox.close_sync()
    with pytest.raises(RewardSandboxDied, match="gone before scoring.*memory limit"):
        asyncio.run(run_reward(HiddenTestsSpec(), sandbox, generate_task(SEED)))


def test_a_crashing_spec_and_a_non_finite_score_are_errors():
    task = generate_task(SEED)
    for spec, match in ((RaisingSpec(), "raised KeyError"), (NanSpec(), "not a RewardResult with a finite score")):
        sandbox = open_sandbox(python=True)
        with pytest.raises(RewardCrashed, match=match):
            asyncio.run(ScoredSandbox(sandbox, spec, task).finish())
        assert sandbox.closed


def test_a_missing_container_runtime(monkeypatch):
    """A backend whose runtime is missing: the env refuses at reset, the judge's cases raise a
    RewardUnavailable, each saying what to do."""
    import arl.sandbox.oci as oci

    monkeypatch.setattr(oci.shutil, "which", lambda name, *a, **k: None)
    monkeypatch.setattr(oci, "_probe", oci._problem)  # not the probe cached for this process
    assert "apt-get install podman" in backend_problem("podman")
    with pytest.raises(SandboxUnavailable, match="podman is not installed .*apt-get install podman"):
        BugFixEnv(isolation="podman").reset(seed=SEED)
    sandbox = open_sandbox(python=True)
    sandbox.isolation = "podman"  # the episode's sandbox claims the backend the judge then cannot open
    try:
        with pytest.raises(RewardUnavailable, match="cannot start.*apt-get install podman") as caught:
            asyncio.run(run_reward(HiddenTestsSpec(), sandbox, generate_task(SEED)))
        assert isinstance(caught.value, JudgeUnavailable) and isinstance(caught.value, RewardError)
    finally:
        sandbox.close_sync()


def oracle_failures(seeds) -> dict[int, RewardResult]:
    """The tasks among ``seeds`` whose gold fix (the solver's str_replace) does not score 1.0."""
    async def one(seed: int):
        task = generate_task(seed)
        buggy, fixed = task.fix
        return seed, await rescore_episode(seed, {task.filename: task.source.replace(buggy, fixed)},
                                           HiddenTestsSpec(cases_per_process=len(task.cases)))

    async def main():
        return await asyncio.gather(*(one(s) for s in seeds))

    return {seed: result for seed, result in asyncio.run(main()) if result.score != 1.0}


def test_every_family_and_bug_kind_scores_one_under_its_oracle():
    """BugFix's tasks are generated per seed (no finite list): a seeded sample, the first seeds
    until every function family has been the buggy target and every bug kind drawn (seeds 0-92).
    A task failing its own oracle is named here."""
    from arl.envs.bugfix.tasks import FAMILIES

    kinds_known = {"ignored argument", "off-by-one", "swapped arguments", "swapped operands", "wrong comparison",
                   "wrong initial value", "wrong operator", "wrong variable"}  # the kinds seeds 0-399 draw
    seeds, families, kinds = [], set(), set()
    for seed in range(1000):
        task = generate_task(seed)
        seeds.append(seed)
        families.add(next(k for k in FAMILIES if task.function in FAMILIES[k].names))
        kinds.add(task.bug_kind)
        if families == set(FAMILIES) and kinds == kinds_known:
            break
    assert families == set(FAMILIES) and kinds == kinds_known
    assert oracle_failures(seeds) == {}, "tasks failing their own oracle"


def test_rescore_a_stored_episode_under_a_changed_spec():
    task = generate_task(SEED)
    env = BugFixEnv()
    env.reset(seed=SEED)
    reward, info = play(env, solution_calls(task)[1:])  # the fix, then submit
    files = info["final_files"]
    assert reward == 1.0 and set(files) == {task.filename} and task.fix[1] in files[task.filename]
    # the same spec gives the same score; a changed spec (fewer cases per process, a new name) too
    assert asyncio.run(rescore_episode(SEED, files)).score == 1.0
    # a spec that is stricter scores the stored episode differently, without replaying the agent
    class HalfCredit(HiddenTestsSpec):
        async def score(self, sandbox, task):
            result = await super().score(sandbox, task)
            return RewardResult(result.score / 2, result.tests, result.extra)

    assert asyncio.run(rescore_episode(SEED, files, HalfCredit(case_limits=CASE_LIMITS))).score == 0.5
    # the buggy files score what the buggy code scores
    buggy = asyncio.run(rescore_episode(SEED, {task.filename: task.source}))
    assert 0 < buggy.score < 1


def test_arl_eval_rescore_scores_stored_bugfix_episodes_from_their_files(capsys, tmp_path):
    """`arl eval tiny_bugfix_proxy --oracle --out DIR` stores each episode's final files;
    `arl eval --rescore DIR` scores them again (no agent, no model): a row whose files are put
    back to the buggy code loses its 1.0, the others keep it."""
    from arl.cli import main
    from arl.rollout import evaluate as ev

    out = tmp_path / "eval"
    assert main(["eval", "tiny_bugfix_proxy", "--oracle", "--seeds", "0:3", "--out", str(out)]) == 0
    rows = ev.read_rows(out / ev.RESULTS_FILE)
    assert len(rows) == 3 and all(r["score"] == 1.0 and r["final_files"] for r in rows)
    broken = rows[0]["seed"]
    task = generate_task(broken)
    rows[0] = {**rows[0], "final_files": {task.filename: task.source}}
    (out / ev.RESULTS_FILE).write_text("".join(ev.json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(["eval", "--rescore", str(out)]) == 0
    assert "rescored 3 rollouts from the files their episodes ended with, 1 changed" in capsys.readouterr().out
    rescored = {r["seed"]: r for r in ev.read_rows(out / ev.RESCORED_FILE)}
    assert 0 < rescored[broken]["score"] < 1 and not rescored[broken]["success"]
    assert all(r["score"] == 1.0 for seed, r in rescored.items() if seed != broken)


def test_the_trainer_reports_a_failed_reward_by_its_class():
    """`rollout_metrics` (what the trainer logs) counts env errors by class: a failed spec is seen as
    ``rollout/env_error/RewardTimeout``, not lost among other env errors, and not as a 0 reward."""
    from arl.rollout.base import Episode
    from arl.rollout.metrics import rollout_metrics
    from arl.rollout.records import Trajectory

    def episode(error):
        return Episode(Trajectory("arl/BugFix-v0", "g", 0, SEED, status="Failed", exit_reason="env_error",
                                  error=error), [])

    metrics = rollout_metrics([episode("arl.envs.reward_spec.RewardTimeout: reward 'x' ran past its timeout"),
                               episode("arl.envs.reward_spec.RewardTimeout: again"), episode("the env broke: no class named")])
    assert metrics["rollout/env_error/RewardTimeout"] == 2.0 and metrics["rollout/env_error/other"] == 1.0
    assert metrics["rollout/exit/env_error"] == 3.0


def test_the_trainer_logs_a_specs_numbers_beside_the_score():
    """An episode whose last step reports ``reward_extra`` (`RewardResult.metrics`: e.g.
    RealBugFix's ``tests_broken_passed``) is averaged into ``rollout/reward/<name>`` over the
    episodes that report it; a batch without any logs no such key."""
    from arl.rollout.base import Episode
    from arl.rollout.metrics import rollout_metrics
    from arl.rollout.records import Trajectory, Turn

    def episode(extra):
        turn = Turn(observation="", prompt_ids=[1], response_ids=[2], response_logprobs=[0.0],
                    info={} if extra is None else {"reward_extra": extra})
        return Episode(Trajectory("arl/RealBugFix-v0", "g", 0, SEED, turns=[turn]), [])

    metrics = rollout_metrics([episode({"tests_broken_passed": 0.0}), episode({"tests_broken_passed": 1.0}),
                               episode({"tests_broken_passed": 1.0}), episode(None)])
    assert metrics["rollout/reward/tests_broken_passed"] == pytest.approx(2 / 3)
    assert not any(key.startswith("rollout/reward/") for key in rollout_metrics([episode(None)]))


@pytest.mark.parametrize("runtime", CONTAINERS)
def test_in_a_container_the_spec_scores_and_a_removed_container_is_a_dead_sandbox(runtime):
    import subprocess

    from arl.sandbox.oci import _rm

    task = generate_task(SEED)
    env = BugFixEnv(isolation=runtime)
    env.reset(seed=SEED)
    reward, info = play(env, solution_calls(task))
    assert reward == 1.0 and info["success"] and env.sandbox.closed
    # the container removed under the agent: the next command ends the episode, no reward
    env.reset(seed=SEED)
    env.step(assistant_message("bash", {"command": "true"}))
    container = env.sandbox.container
    subprocess.run(_rm(runtime, container), capture_output=True, check=True)
    with pytest.raises(SandboxDied, match="died mid-episode"):
        env.step(assistant_message("bash", {"command": "ls"}))
    # removed between the agent's last command and the reward: the reward is an error, not a 0
    env.reset(seed=SEED)
    env.step(assistant_message("bash", {"command": "true"}))
    subprocess.run(_rm(runtime, env.sandbox.container), capture_output=True, check=True)
    with pytest.raises(RewardSandboxDied, match="gone before scoring"):
        env.step(assistant_message("submit", {}))
    env.close()
