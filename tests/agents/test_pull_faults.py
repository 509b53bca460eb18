"""Pull mode's faults are data: timeouts, crashes, malformed frames and results, cancellation.

The agents here speak the frame protocol by hand (no arl import: they start fast and can send
exactly the bytes a broken agent would).
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import anyio
import pytest

from arl.agents.pull import PullModeRunner
from arl.config import ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.intercept import ChatHandler, InProcessClient, MessageTracker
from arl.intercept.exchange import responder
from arl.rollout import EpisodeSpec
from arl.rollout.proxy import ProxyEnvManager

pytestmark = pytest.mark.anyio

# A minimal hand-written pull-mode agent: frames out on stdout, responses in on stdin.
PROTOCOL = textwrap.dedent("""
    import json, os, sys
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    def send(*fields, body=b""):
        out.write(b" ".join([b"@arl-pull/1", *(str(f).encode() for f in fields)]) + b"\\n" + body)
        out.flush()
    def receive():
        magic, kind, rid, status, size = inp.readline().split()
        return int(rid), int(status), json.loads(inp.read(int(size)))
    def end(result):
        data = json.dumps(result).encode() if not isinstance(result, bytes) else result
        send("end", len(data), body=data)
""")
CHAT = "/v1/chat/completions"


def agent(body: str) -> list[str]:
    return [sys.executable, "-c", PROTOCOL + textwrap.dedent(body)]


def spec() -> EpisodeSpec:
    return EpisodeSpec(env_id="arl/FrozenLake-v0", seed=2, group_id="train_0_2", episode_id=0)


def answering(tokenizer, tracker=None):
    """A responder on a fresh episode handler (the scripted engine)."""
    handler = ChatHandler(ScriptedEngine(tokenizer), tracker or MessageTracker(tokenizer))
    return responder(InProcessClient(handler, "e"))


async def run_episode(tokenizer, command, config=None, **kwargs):
    config, runners = config or ManagerConfig(max_tokens=8), []

    def factory(client, s, config):
        runners.append(PullModeRunner(responder(client), command, **{"timeout_s": 60, **kwargs}))
        return runners[-1]

    async with ProxyEnvManager(ScriptedEngine(tokenizer), config, factory, granularity="traj") as manager:
        episode = await manager.run_episode(spec())
    return episode, runners[0]


async def test_malformed_frames_get_error_responses_and_the_session_goes_on(tiny_tokenizer):
    body = f"""
        seen = {{}}
        send("req", 1, "POST", "{CHAT}", 7, body=b"notjson")                   # body is not JSON
        seen["bad_json"] = receive()[1]
        send("req", 2, "POST")                                                  # header too short
        seen["short_header"] = receive()[1]
        out.write(b"@arl-pull/1 what is this\\n"); out.flush()                  # names no request: skipped
        print("a stray line of the agent's own", flush=True)                    # not a frame: output
        big = 5 * 2**20
        send("req", 3, "POST", "{CHAT}", big, body=b"x" * big)                  # over the body limit
        seen["too_large"] = receive()[1]
        send("req", 4, "GET", "/v1/nowhere", 0)                                 # unknown route
        seen["unknown_route"] = receive()[1]
        send("req", 5, "GET", "{CHAT}", 0)                                      # wrong method
        seen["wrong_method"] = receive()[1]
        good = json.dumps({{"model": "arl", "messages": [{{"role": "user", "content": "hi"}}]}}).encode()
        send("req", 6, "POST", "{CHAT}", len(good), body=good)                  # a good call still works
        rid, status, reply = receive()
        seen["good"], seen["good_id"] = status, rid
        seen["answer"] = float(reply["choices"][0]["message"]["role"] == "assistant")
        end({{"score": 0.5, "metrics": seen}})
    """
    tracker = MessageTracker(tiny_tokenizer)
    runner = PullModeRunner(answering(tiny_tokenizer, tracker), agent(body), timeout_s=60)
    result = await runner.run_job(0)
    assert (result.status, result.score) == ("Finished", 0.5), result.error
    assert result.metrics == {"bad_json": 400, "short_header": 400, "too_large": 413, "unknown_route": 404,
                              "wrong_method": 405, "good": 200, "good_id": 6, "answer": 1,
                              "isolated_uid": float(runner.tool_isolation == "uid")}
    assert runner.stats == {"requests": 5, "malformed_frames": 2}
    assert len(tracker.requests) == 1  # only the good call reached the handler


@pytest.mark.parametrize(
    "body, needle",
    [
        ("print('boom', file=sys.stderr); sys.exit(3)", "boom"),  # a crash
        ("print('gone')", "without ending the session"),  # exit 0 without an end frame
        ("end(b'not json')", "malformed result"),
        ("end({'status': 'Huh'})", "malformed result"),
        ("end(b'[1, 2]')", "malformed result"),
        ("end({'score': 1.0}); sys.exit(5)", "exited with 5"),  # a valid result, then a failing exit
    ],
)
async def test_crashes_and_bad_results_are_agent_errors(tiny_tokenizer, body, needle):
    episode, _ = await run_episode(tiny_tokenizer, agent(body))
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("Failed", "agent_error")
    assert needle in episode.trajectory.error


async def test_missing_program_is_an_agent_error(tiny_tokenizer):
    episode, _ = await run_episode(tiny_tokenizer, ["/nonexistent/agent"])
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("Failed", "agent_error")


async def test_a_result_stands_when_the_agent_lingers(tiny_tokenizer):
    start = time.monotonic()
    runner = PullModeRunner(answering(tiny_tokenizer), agent("end({'score': 2.0}); import time; time.sleep(600)"),
                            timeout_s=60, exit_grace_s=0.5)
    result = await runner.run_job(0)
    assert time.monotonic() - start < 30
    assert (result.status, result.score) == ("Finished", 2.0), result.error
    assert runner.returncode is None  # killed after its grace, not waited for


def grandchild_agent(marker) -> list[str]:
    """Starts a grandchild, records its pid, then hangs forever without a frame."""
    return agent(f"""
        import subprocess, time
        p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
        open({str(marker)!r}, 'w').write(str(p.pid))
        time.sleep(600)
    """)


def assert_dead(pid: int) -> None:
    for _ in range(100):  # SIGKILLed with its group; give the kernel a moment
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail("the agent's grandchild survived")


async def test_timeout_kills_the_process_group(tiny_tokenizer, tmp_path):
    # sandbox "none": the grandchild's pid is a host pid we can check (bwrap's PID namespace hides it)
    marker = tmp_path / "grandchild.pid"
    start = time.monotonic()
    episode, _ = await run_episode(tiny_tokenizer, grandchild_agent(marker), timeout_s=2, sandbox="none")
    assert time.monotonic() - start < 30
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("Timeout", "timeout")
    assert episode.samples == []
    assert_dead(int(marker.read_text()))


async def test_cancellation_kills_the_process_group(tiny_tokenizer, tmp_path):
    marker = tmp_path / "grandchild.pid"
    runner = PullModeRunner(answering(tiny_tokenizer), grandchild_agent(marker), timeout_s=600, sandbox="none")
    with anyio.move_on_after(30) as scope:  # cancels run_job once the grandchild is up
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run_job, 0)
            while not marker.exists() or not marker.read_text():
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught, "the agent never started its grandchild"
    assert_dead(int(marker.read_text()))


async def test_episode_timeout_in_the_sandbox(tiny_tokenizer):
    """The manager's episode timeout cancels the runner; the sandbox is torn down (any isolation)."""
    config = ManagerConfig(max_tokens=8, episode_timeout_s=2.0)
    start = time.monotonic()
    episode, runner = await run_episode(tiny_tokenizer, agent("import time; time.sleep(600)"), config=config,
                                        timeout_s=600)
    assert time.monotonic() - start < 30
    assert (episode.trajectory.status, episode.trajectory.exit_reason) == ("Timeout", "timeout")
