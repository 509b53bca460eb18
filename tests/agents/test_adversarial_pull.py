"""A pull-mode agent that reports what it should not (issue 28, classes 5, 7 and 9).

- a result with a NaN / Infinity score, or one nested 100k levels deep: before, the first was
  accepted (and the training step raised in the advantage computation), the second raised
  RecursionError out of the runner; now each is an "agent_error" episode with the reason;
- pull-mode BugFix: its tool sandbox inside the agent's sandbox is isolation "none", the task
  generator readable, so it has no hidden tests: refused (trainer side and env side).

The agents speak the frame protocol by hand (as tests/agents/test_pull_faults.py's do).
"""

from __future__ import annotations

import sys
import textwrap

import attrs
import pytest

from arl.agents.pull import PullModeRunner
from arl.config import load_config
from arl.envs.bugfix.env import PULL_MODE_REFUSAL, BugFixEnv, HiddenTestsUnavailable
from arl.rollout import EpisodeSpec
from arl.rollout.factory import make_manager
from arl.rollout.runners import check_pull_env, pull_runner

pytestmark = pytest.mark.anyio

PROTOCOL = textwrap.dedent("""
    import sys
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    def end(data):
        out.write(b"@arl-pull/1 end " + str(len(data)).encode() + b"\\n" + data)
        out.flush()
    def request(body):
        out.write(b"@arl-pull/1 req 1 POST /v1/chat/completions " + str(len(body)).encode() + b"\\n" + body)
        out.flush()
        magic, kind, rid, status, size = inp.readline().split()
        inp.read(int(size))
        return int(status)
""")


async def never_called(method: str, path: str, body: bytes):
    raise AssertionError("no request reaches the handler in these tests")


def runner(body: str, respond=never_called) -> PullModeRunner:
    return PullModeRunner(respond, [sys.executable, "-c", PROTOCOL + textwrap.dedent(body)], timeout_s=60,
                          sandbox="none")


@pytest.mark.parametrize("document, reason", [
    (b'{"score": NaN, "success": true}', "NaN"),
    (b'{"score": Infinity}', "Infinity"),
    (b'{"score": 1e999}', "finite"),
    (b'{"score": 1.0, "step_scores": [NaN]}', "NaN"),
    (b"[" * 100_000, "nested"),
    (b'{"score": 1, "step_infos": [{"state": ' + b"[" * 50_000 + b"]" * 50_000 + b"}]}", "nested"),
], ids=["nan", "inf", "overflow", "step-nan", "deep", "deep-info"])
async def test_bad_results_end_the_episode_as_agent_error(document, reason):
    result = await runner(f"end({document!r})").run_job(0)
    assert (result.status, result.exit_reason) == ("Failed", "agent_error"), result
    assert "malformed result" in result.error and reason in result.error
    assert result.score == 0.0 and result.step_scores == []


async def test_deeply_nested_request_body_is_a_400_and_the_session_goes_on():
    from arl.intercept.exchange import responder

    class NoClient:  # the responder refuses the body before the handler is called
        handler, episode_key = object(), "e"

    body = """
        status = request(b"[" * 100_000)
        end(b'{"score": 0.25, "metrics": {"status": %d}}' % status)
    """
    pull = runner(body, responder(NoClient()))
    result = await pull.run_job(0)
    assert (result.status, result.score) == ("Finished", 0.25), result.error
    assert result.metrics == {"status": 400.0, "isolated_uid": float(pull.tool_isolation == "uid")}


# -- class 9: pull-mode BugFix has no hidden tests -------------------------------------------------
def test_pull_mode_bugfix_is_refused_before_any_agent_starts():
    config = load_config("tiny_bugfix_proxy", ["engine.backend=scripted"])
    rollout = attrs.evolve(config.rollout, proxy=attrs.evolve(
        config.rollout.proxy, runner="pull", transport="inprocess",
        runner_kwargs={"command": ["{python}", "-m", "arl.agents.examples.bugfix_agent"]}))
    with pytest.raises(ValueError, match="no hidden tests"):
        make_manager(None, rollout)  # the check comes before the manager needs an engine
    spec = EpisodeSpec("arl/BugFix-v0", 0, "g", 0)
    with pytest.raises(ValueError, match="no hidden tests"):  # the factory itself, for direct users
        pull_runner(None, spec, rollout.manager, command=["true"])
    check_pull_env("arl/FrozenLake-v0", {})  # a game's reward is not the agent's to see: allowed
    check_pull_env("arl/BugFix-v0", {"allow_unhidden_tests": True})  # mechanics tests only, said so


def test_bugfix_env_refuses_pull_mode_without_a_real_sandbox(monkeypatch):
    monkeypatch.setenv("ARL_TRANSPORT", "pipe")  # what PullModeRunner sets in the agent's environment
    env = BugFixEnv(isolation="none")
    with pytest.raises(HiddenTestsUnavailable, match="no hidden tests"):
        env.reset(seed=0)
    assert env.sandbox is None  # nothing left behind
    assert "push mode" in PULL_MODE_REFUSAL
    allowed = BugFixEnv(isolation="none", allow_unhidden_tests=True)
    try:
        observation, info = allowed.reset(seed=0)
        assert info["isolation"] == "none" and observation.startswith("Issue:")
    finally:
        allowed.close()
