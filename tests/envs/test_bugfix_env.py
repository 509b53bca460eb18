"""BugFixEnv: the scripted solver, tool-call fuzzing, truncation, hidden tests, the step limit,
and the env played by `BugFixRunner` through the proxy (both transports) with the scripted engine."""

from __future__ import annotations

import asyncio
import json
import random
import re
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import pytest

from arl.agents.bugfix import bugfix_runner
from arl.config import ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.envs import register_envs
from arl.envs.bugfix import BugFixEnv, assistant_message, generate_task, solution_calls, solution_text
from arl.envs.bugfix.env import ARL_PACKAGE, truncate
from arl.rollout import EpisodeSpec
from arl.rollout.proxy import ProxyEnvManager
from arl.sandbox.sandbox import SandboxLimits, bwrap_problem
from tests.envs.backend_params import CONTAINERS

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unavailable: {bwrap_problem()}")
MODES = ["none", pytest.param("auto", marks=needs_bwrap), *CONTAINERS]  # every backend this machine has


def call(name, arguments, call_id="c0"):
    return assistant_message(name, arguments, call_id)


def raw_call(name, arguments: str, call_id="c0"):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


@pytest.fixture
def env():
    env = BugFixEnv(max_steps=8, limits=SandboxLimits(wall_s=5.0, cpu_s=5.0), output_chars=300)
    yield env
    env.close()


@pytest.mark.parametrize("isolation", MODES)
def test_scripted_solver_and_untouched_submit(isolation):
    env = BugFixEnv(isolation=isolation)
    for seed in (0, 1):
        observation, info = env.reset(seed=seed)
        task = generate_task(seed)
        assert task.issue in observation and info["task_seed"] == seed
        assert env.sandbox is not None and (env.sandbox.workdir / task.filename).read_text() == task.source
        for i, (name, arguments) in enumerate(solution_calls(task)):
            messages, reward, terminated, truncated, info = env.step(call(name, arguments, f"c{i}"))
            assert messages[0]["tool_call_id"] == f"c{i}" and info["action_valid"], messages
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
        assert info["tests_passed"] == info["tests_total"] == len(task.test_names)
        workdir = env.sandbox.workdir
        assert not workdir.exists()  # the episode's sandbox is gone with the episode
        env.reset(seed=seed)
        messages, reward, terminated, _, info = env.step(call("submit", {}))
        assert terminated and 0 <= reward < 1 and not info["success"]
        assert f"{info['tests_passed']}/{len(task.test_names)} hidden tests pass" in messages[-1]["content"]
    env.close()


def test_registered_and_step_limit():
    register_envs()
    made = gym.make("arl/BugFix-v0", max_steps=2, isolation="none").unwrapped
    assert isinstance(made, BugFixEnv) and made.max_steps == 2
    made.reset(seed=3)
    _, reward, terminated, truncated, info = made.step(call("bash", {"command": "ls"}))
    assert (reward, terminated, truncated) == (0.0, False, False)
    messages, reward, terminated, truncated, info = made.step(call("bash", {"command": "true"}))
    assert truncated and not terminated and reward == info["tests_passed"] / info["tests_total"] < 1
    assert "step limit" in messages[-1]["content"]
    messages, *_ = made.step(call("submit", {}))  # after the end: an error message, no exception
    assert "episode is over" in messages[0]["content"]
    made.close()


def test_tool_call_fuzzing():
    env = BugFixEnv(max_steps=10**6, limits=SandboxLimits(wall_s=5.0, cpu_s=5.0), isolation="none")
    env.reset(seed=2)
    cases = [
        ({"role": "assistant", "content": "I will fix it"}, "no tool call"),
        ("not json at all", "no tool call"),
        (42, "must be an object"),
        ({"role": "assistant", "tool_calls": "bash"}, "must be a list"),
        (raw_call("bash", "{not json"), "not valid JSON"),
        (raw_call("bash", "[1, 2]"), "must be a JSON object"),
        (raw_call("rm_rf", "{}"), "unknown tool"),
        (call("bash", {"cmd": "ls"}), "bash takes one string argument"),
        (call("bash", {"command": ["ls"]}), "bash takes one string argument"),
        (call("editor", {"command": "delete", "path": "x"}), "unknown command"),
        (call("editor", {"command": "view"}), "missing required argument 'path'"),
        (call("editor", {"command": "view", "path": "/etc/passwd"}), "outside the work dir"),
        (call("editor", {"command": "view", "path": "../../etc/passwd"}), "outside the work dir"),
        (call("editor", {"command": "view", "path": "nope.py"}), "is not a file"),
        (call("editor", {"command": "view", "path": env.task.filename, "view_range": [5, 2]}), "view_range"),
        (call("editor", {"command": "create", "path": env.task.filename, "file_text": ""}), "already exists"),
        (call("editor", {"command": "str_replace", "path": env.task.filename, "old_str": "no such text"}),
         "did not appear verbatim"),
        (call("editor", {"command": "str_replace", "path": env.task.filename, "old_str": "def"}), "appears"),
        (call("editor", {"command": "insert", "path": env.task.filename, "new_str": "x", "insert_line": 999}),
         "outside 0.."),
        (call("editor", {"command": "view", "path": "x", "colour": "red"}), "unexpected argument"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "bash", "arguments": "{}"}}]}, "bash takes"),
    ]
    for message, expected in cases:
        messages, reward, terminated, truncated, info = env.step(message)
        text = "\n".join(m["content"] for m in messages)
        assert expected in text, (message, text)
        assert not info["action_valid"] and reward == 0.0 and not terminated
    rng = random.Random(0)  # random garbage: always a reply, never an exception
    atoms = [None, 0, -1, 1.5, "", "x", "bash", "editor", [], {}, "{", "}", '{"command": 1}', True]
    for _ in range(300):
        def junk(depth=0):
            if depth > 2 or rng.random() < 0.4:
                return rng.choice(atoms)
            if rng.random() < 0.5:
                return [junk(depth + 1) for _ in range(rng.randint(0, 3))]
            keys = ["role", "tool_calls", "function", "name", "arguments", "id", "type", "command"]
            return {rng.choice(keys): junk(depth + 1) for _ in range(rng.randint(0, 4))}
        message = {"role": "assistant", "tool_calls": [junk() for _ in range(rng.randint(0, 3))]}
        messages, *_ = env.step(message)
        assert messages and all(isinstance(m["content"], str) for m in messages)
    env.close()


def test_huge_output_is_truncated_with_a_marker(env):
    env.reset(seed=4)
    messages, *_ = env.step(call("bash", {"command": "seq 1 100000"}))
    text = messages[0]["content"]
    assert re.search(r"\[\.\.\. \d+ characters truncated \.\.\.\]", text) and len(text) < 500
    assert text.startswith("1\n2\n3\n")
    messages, *_ = env.step(call("bash", {"command": "yes"}))  # floods: killed, said so
    assert "characters truncated" in messages[0]["content"] and "[killed: too much output]" in messages[0]["content"]
    messages, *_ = env.step(call("bash", {"command": "seq 1 100 | tail -c 150; exit 4"}))
    assert "truncated" in messages[0]["content"] or messages[0]["content"].endswith("[exit code 4]")
    assert truncate("x" * 10, 20) == "x" * 10


def test_editor_round_trip(env):
    env.reset(seed=6)
    name = env.task.filename
    steps = [
        ({"command": "create", "path": "notes/a.txt", "file_text": "one\ntwo\n"}, "Created notes/a.txt"),
        ({"command": "insert", "path": "notes/a.txt", "new_str": "zero", "insert_line": 0}, "1\tzero"),
        ({"command": "str_replace", "path": "notes/a.txt", "old_str": "two", "new_str": "2"}, "3\t2"),
        ({"command": "view", "path": "notes/a.txt", "view_range": [2, -1]}, "     2\tone\n     3\t2"),
        ({"command": "view", "path": "."}, f"{name}\nnotes/\nnotes/a.txt"),
    ]
    for arguments, expected in steps:
        messages, *_ = env.step(call("editor", arguments))
        assert expected in messages[0]["content"], messages[0]["content"]
    messages, *_ = env.step(call("bash", {"command": "cat notes/a.txt && echo more >> notes/a.txt"}))
    assert messages[0]["content"] == "zero\none\n2\n[exit code 0]"  # the sandbox user may edit the editor's files


@needs_bwrap
def test_hidden_tests_are_unreachable_before_submit():
    env = BugFixEnv(limits=SandboxLimits(wall_s=30.0, cpu_s=30.0))
    env.reset(seed=8)
    task = env.task
    probe = ("find / \\( -path /proc -o -path /sys -o -path /usr -o -path /dev \\) -prune -o "
             f"-name '{task.test_filename}' -print 2>/dev/null; echo ---; "
             f"python -c 'import arl' 2>&1 | tail -1; ls {ARL_PACKAGE}/envs/bugfix 2>&1; ls -a /tmp")
    before = set(Path(tempfile.gettempdir()).glob("arl-hidden-*"))
    messages, *_ = env.step(call("bash", {"command": probe}))
    out = messages[0]["content"]
    found, _, rest = out.partition("---")
    assert found.strip() == "" and "No module named 'arl'" in rest and "No such file" in rest, out
    messages, reward, terminated, *_ = env.step(call("submit", {}))
    assert terminated and 0 < reward < 1  # the tests ran (and the distractors pass) at submit
    assert set(Path(tempfile.gettempdir()).glob("arl-hidden-*")) == before  # and are gone again
    env.close()


def test_sync_step_inside_a_running_loop():
    env = BugFixEnv(isolation="none")
    env.reset(seed=1)

    async def inside():
        return env.step(call("bash", {"command": "echo from-a-loop"}))

    messages, *_ = asyncio.run(inside())
    assert messages[0]["content"] == "from-a-loop\n[exit code 0]"
    env.close()


# -- through the proxy -----------------------------------------------------------------------------


STALL_S = 8  # > two episodes of reset, 3 steps and a judged submit (~1 s of sandboxed runners) on a loaded machine


def _solver_engine(tokenizer, seeds, stall_seed=None):
    """A scripted engine that plays the known solution of each task (found by its issue line);
    ``stall_seed``'s first turn is a slow command instead."""
    tasks = {generate_task(s).issue: generate_task(s) for s in seeds}

    def respond(prompt: str) -> str:
        task = tasks[re.search(r"Issue: (.*)", prompt).group(1)]
        turn = prompt.count("<|im_start|>assistant") - 1
        if task.seed == stall_seed:
            if turn == 0:
                return f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "sleep {STALL_S}"}}}}\n</tool_call>'
            turn -= 1
        return solution_text(task, turn)

    return ScriptedEngine(tokenizer, responses=respond, max_model_len=4096)


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["inprocess", "http"])
async def test_bugfix_runner_through_the_proxy(tiny_tokenizer, transport):
    stall = transport == "inprocess"  # one stalled episode is enough to show steps do not block
    engine = _solver_engine(tiny_tokenizer, range(3), stall_seed=0 if stall else None)
    config = ManagerConfig(max_tokens=256, env_kwargs={"isolation": "auto"})
    done: dict[int, float] = {}
    start = time.monotonic()
    async with ProxyEnvManager(engine, config, bugfix_runner, transport=transport,
                               granularity="traj") as manager:
        async def play(seed):
            episode = await manager.run_episode(EpisodeSpec("arl/BugFix-v0", seed, f"train_0_{seed}", 0))
            done[seed] = time.monotonic()
            return episode

        episodes = await asyncio.gather(*(play(s) for s in range(3)))
    for episode in episodes:
        traj, (sample,) = episode.trajectory, episode.samples
        assert traj.ok and traj.success and traj.episode_score == 1.0, traj.error
        assert [t.action for t in traj.turns][-3:] == ["editor", "editor", "submit"]
        assert [t for t, m in zip(sample.input_ids, sample.response_mask, strict=True) if m] == [
            t for turn in traj.turns for t in turn.response_ids]
        assert sample.info["tracker"]["untracked_assistant"] == 0
        assert len({t.state_key for t in traj.turns}) == 2  # the repo state changes once: the fix
    if stall:  # the others played to the end during the stalled episode's `sleep` (steps are awaited)
        assert max(done[1], done[2]) - start < STALL_S < done[0] - start


def test_runner_kwargs_reach_the_env():
    runner = bugfix_runner(None, EpisodeSpec("arl/BugFix-v0", 0, "g", 0),
                           ManagerConfig(max_tokens=32, env_kwargs={"max_steps": 3, "isolation": "none"}))
    env = runner.make_env()
    assert env.max_steps == 3 and env.isolation == "none" and json.dumps(env.tools)
