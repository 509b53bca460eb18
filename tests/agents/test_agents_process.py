"""PushModeRunner: an agent in its own OS process (stock openai client) through the HTTP proxy."""

from __future__ import annotations

import os
import sys
import time

import pytest

from arl.agents import PushModeRunner
from arl.config import ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.rollout import EpisodeSpec, TrajEnvManager
from arl.rollout.proxy import ProxyEnvManager

pytestmark = pytest.mark.anyio

AGENT = [sys.executable, "-m", "arl.agents.examples.gym_agent"]
CONFIG = ManagerConfig(max_tokens=24)


def spec(member=0, seed=2, env_id="arl/FrozenLake-v0") -> EpisodeSpec:
    return EpisodeSpec(env_id=env_id, seed=seed, group_id=f"train_0_{seed}", episode_id=member)


@pytest.fixture
def engine(tiny_tokenizer):
    return ScriptedEngine(tiny_tokenizer)


def push(command, **kwargs):
    def factory(client, s, config):
        return PushModeRunner(client, command, **kwargs)

    return factory


async def test_push_mode_agent_matches_traj_manager(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.3)
    command = [*AGENT, "--env-id", "arl/Sokoban-v0", "--max-tokens", "24"]
    async with ProxyEnvManager(engine, CONFIG, push(command, timeout_s=120), transport="http",
                               granularity="traj") as manager:
        got = await manager.run_episode(spec(env_id="arl/Sokoban-v0"))
    want = await TrajEnvManager(engine, CONFIG).run_episode(spec(env_id="arl/Sokoban-v0"))
    assert got.trajectory.status == "Finished", got.trajectory.error
    assert got.trajectory.exit_reason == want.trajectory.exit_reason
    assert got.trajectory.episode_score == pytest.approx(want.trajectory.episode_score)
    assert [s.input_ids for s in got.samples] == [s.input_ids for s in want.samples]
    assert [s.response_mask for s in got.samples] == [s.response_mask for s in want.samples]


async def test_timeout_kills_the_process_group(engine, tmp_path):
    # The agent starts a grandchild, then hangs; both must be gone after the timeout.
    marker = tmp_path / "grandchild.pid"
    script = (
        "import os, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    start = time.monotonic()
    async with ProxyEnvManager(engine, CONFIG, push([sys.executable, "-c", script], timeout_s=2),
                               transport="http", granularity="traj") as manager:
        episode = await manager.run_episode(spec())
    assert time.monotonic() - start < 30
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("Timeout", "timeout")
    assert episode.samples == []
    pid = int(marker.read_text())
    for _ in range(100):  # the grandchild was SIGKILLed with its group; give the kernel a moment
        if not alive(pid):
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the agent's grandchild survived the timeout")


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as dead: containers may lack a reaping init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


async def test_episode_timeout_cancels_and_kills(engine):
    config = ManagerConfig(max_tokens=24, episode_timeout_s=2.0)
    runners = []

    def factory(client, s, config):
        runners.append(PushModeRunner(client, [sys.executable, "-c", "import time; time.sleep(600)"], timeout_s=600))
        return runners[-1]

    async with ProxyEnvManager(engine, config, factory, transport="http", granularity="traj") as manager:
        episode = await manager.run_episode(spec())
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("Timeout", "timeout")


@pytest.mark.parametrize(
    "script, needle",
    [
        ("import sys; print('boom', file=sys.stderr); sys.exit(3)", "boom"),
        ("import os; open(os.environ['ARL_RESULT_PATH'], 'w').write('not json')", "malformed"),
        ("import os; open(os.environ['ARL_RESULT_PATH'], 'w').write('{\"status\": \"Huh\"}')", "malformed"),
    ],
)
async def test_crashes_and_bad_results_are_agent_errors(engine, script, needle):
    async with ProxyEnvManager(engine, CONFIG, push([sys.executable, "-c", script], timeout_s=60),
                               transport="http", granularity="traj") as manager:
        episode = await manager.run_episode(spec())
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("Failed", "agent_error")
    assert needle in episode.trajectory.error


def test_needs_an_http_client():
    from arl.intercept import InProcessClient

    with pytest.raises(ValueError, match="HTTP client"):
        PushModeRunner(InProcessClient(None, "e"), ["true"], timeout_s=1)


async def test_agent_process_gets_a_minimal_environment(monkeypatch):
    """The agent may run model-written code: the trainer's secrets must not reach it."""
    import types

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("ARL_TEST_PASS_ME", "named")
    script = (
        "import json, os\n"
        "env = os.environ\n"
        "flags = {'leaked': 'AWS_SECRET_ACCESS_KEY' in env, 'passed': env.get('ARL_TEST_PASS_ME') == 'named',\n"
        "         'extra': env.get('MY_EXTRA') == '1', 'key': env.get('OPENAI_API_KEY') == 'tok-123'}\n"
        "json.dump({'metrics': {k: float(v) for k, v in flags.items()}}, open(env['ARL_RESULT_PATH'], 'w'))\n"
    )
    client = types.SimpleNamespace(base_url="http://127.0.0.1:9/v1", api_key="tok-123")  # never called
    runner = PushModeRunner(client, [sys.executable, "-c", script], timeout_s=60, env_extra={"MY_EXTRA": "1"},
                            inherit_env=["ARL_TEST_PASS_ME"])
    result = await runner.run_job(0)
    assert result.status == "Finished", result.error
    assert result.metrics == {"leaked": 0.0, "passed": 1.0, "extra": 1.0, "key": 1.0,
                              "isolated_uid": float(runner.isolation == "uid")}
