"""Out-of-process agents and client-side caches: a push-mode agent's response caches live in its
episode's own work dir (no cache survives into the next episode), and an agent process that
makes no model call ends NoData with the reason."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from arl.agents import PushModeRunner
from arl.agents.pull import PullModeRunner
from arl.config import ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.intercept.exchange import responder
from arl.rollout import EpisodeSpec
from arl.rollout.proxy import ProxyEnvManager

pytestmark = pytest.mark.anyio

CONFIG = ManagerConfig(max_tokens=24)
CACHE_VARS = ("DSPY_CACHEDIR", "DSP_CACHEDIR", "XDG_CACHE_HOME", "HF_HOME", "TORCH_HOME", "UV_CACHE_DIR", "HOME",
              "ARL_RESULT_PATH")


def spec(member: int = 0, seed: int = 4) -> EpisodeSpec:
    return EpisodeSpec("arl/FrozenLake-v0", seed, f"train_0_{seed}", member)


def push(command, **kwargs):
    return lambda client, s, config: PushModeRunner(client, command, timeout_s=60, **kwargs)


# Leaves a file in DSPy's cache dir (as a cache would), notes whether a previous episode's file was
# there, makes one model call, and reports its cache variables in the result's `error` (which a
# Finished episode keeps): an agent under a uid of its own could not write the test's tmp_path.
CACHE_PROBE = textwrap.dedent("""
    import json, os, sys, openai
    from arl.agents.process import write_result
    seen = {k: os.environ.get(k) for k in json.loads(sys.argv[1])}
    seen["hit"] = False
    if seen["DSPY_CACHEDIR"]:
        os.makedirs(seen["DSPY_CACHEDIR"], exist_ok=True)
        marker = os.path.join(seen["DSPY_CACHEDIR"], "entry")
        seen["hit"] = os.path.exists(marker)
        open(marker, "w").write("a cached reply")
    openai.OpenAI().chat.completions.create(model=os.environ["ARL_MODEL"], messages=[{"role": "user", "content": "hi"}])
    write_result({"score": 1.0, "error": json.dumps(seen)})
""")


async def test_push_agent_caches_live_in_its_own_work_dir(tiny_tokenizer):
    command = [sys.executable, "-c", CACHE_PROBE, json.dumps(CACHE_VARS)]
    async with ProxyEnvManager(ScriptedEngine(tiny_tokenizer), CONFIG, push(command), transport="http",
                               granularity="traj") as manager:
        episodes = [await manager.run_episode(spec(member)) for member in range(2)]
    for episode in episodes:
        assert episode.trajectory.status == "Finished", episode.trajectory.error
        assert episode.samples
    seen = [json.loads(e.trajectory.error) for e in episodes]
    workdirs = []
    for env in seen:
        workdir = Path(env["ARL_RESULT_PATH"]).parent  # the episode's own work dir
        workdirs.append(workdir)
        for name in ("DSPY_CACHEDIR", "DSP_CACHEDIR", "XDG_CACHE_HOME"):
            assert env[name] and Path(env[name]).is_relative_to(workdir), (name, env[name])
        # model and package caches stay where they were: $HOME/.cache/..., not in the work dir
        # (unless HOME is the work dir: an agent under a uid of its own)
        for name, sub in (("HF_HOME", "huggingface"), ("TORCH_HOME", "torch"), ("UV_CACHE_DIR", "uv")):
            assert env[name] == os.path.join(env["HOME"], ".cache", sub)
        assert not workdir.exists()  # removed with the episode, its caches too
    assert workdirs[0] != workdirs[1]
    assert [env["hit"] for env in seen] == [False, False]  # no cache survived into the second episode


async def test_push_agent_cache_env_can_be_overridden(tiny_tokenizer, tmp_path):
    """A user who names a cache dir (``env_extra``) gets it, and the model caches then follow it."""
    shared = tmp_path / "shared-cache"
    command = [sys.executable, "-c", CACHE_PROBE, json.dumps(CACHE_VARS)]
    factory = push(command, env_extra={"XDG_CACHE_HOME": str(shared), "DSPY_CACHEDIR": str(shared / "dspy")},
                   isolation="none")  # its own uid could not write the test's tmp_path
    async with ProxyEnvManager(ScriptedEngine(tiny_tokenizer), CONFIG, factory, transport="http",
                               granularity="traj") as manager:
        episode = await manager.run_episode(spec())
    assert episode.trajectory.status == "Finished", episode.trajectory.error
    env = json.loads(episode.trajectory.error)
    assert (env["XDG_CACHE_HOME"], env["DSPY_CACHEDIR"]) == (str(shared), str(shared / "dspy"))
    assert env["HF_HOME"] is None  # not pinned: huggingface_hub follows the user's XDG_CACHE_HOME


async def test_push_agent_without_a_model_call_is_explained_no_data(tiny_tokenizer):
    script = "from arl.agents.process import write_result; write_result({'score': 1.0, 'success': True})"
    async with ProxyEnvManager(ScriptedEngine(tiny_tokenizer), CONFIG, push([sys.executable, "-c", script]),
                               transport="http", granularity="traj") as manager:
        episode = await manager.run_episode(spec())
    traj = episode.trajectory
    assert (traj.status, traj.exit_reason) == ("NoData", "no_data")
    assert episode.samples == []
    assert "client-side" in traj.error and "cache=False" in traj.error
    assert "OPENAI_BASE_URL" in traj.error  # push mode: the address the agent was given
    assert (traj.episode_score, traj.success) == (0.0, False)


async def test_pull_agent_without_a_model_call_is_explained_no_data(tiny_tokenizer):
    script = "from arl.agents.pipe_transport import end_session; end_session({'score': 1.0, 'success': True})"

    def factory(client, s, config):
        return PullModeRunner(responder(client), [sys.executable, "-c", script], timeout_s=60)

    episode = await ProxyEnvManager(ScriptedEngine(tiny_tokenizer), CONFIG, factory,
                                    granularity="traj").run_episode(spec())
    traj = episode.trajectory
    assert (traj.status, traj.exit_reason) == ("NoData", "no_data")
    assert "client-side" in traj.error and "pipe transport" in traj.error
    assert (traj.episode_score, traj.success) == (0.0, False)
