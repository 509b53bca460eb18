"""Pull mode: the agent in a sandbox without network, its stock openai client talking over pipes."""

from __future__ import annotations

import socket
import sys
import textwrap

import anyio
import pytest

from arl.agents.pull import PullModeRunner
from arl.config import ManagerConfig, ProxyConfig, RolloutConfig
from arl.engine.scripted import ScriptedEngine
from arl.intercept import ChatHandler, InProcessClient, MessageTracker
from arl.intercept.exchange import responder
from arl.rollout import EpisodeSpec
from arl.rollout.factory import close_manager, make_manager
from arl.rollout.runners import make_runner_factory, pull_runner

pytestmark = pytest.mark.anyio

AGENT = ["{python}", "-m", "arl.agents.examples.gym_agent"]
ENV_ID = "arl/FrozenLake-v0"


def spec(seed: int) -> EpisodeSpec:
    return EpisodeSpec(env_id=ENV_ID, seed=seed, group_id=f"train_0_{seed}", episode_id=0)


async def play(manager, seeds):
    episodes = {}

    async def one(seed):
        episodes[seed] = await manager.run_episode(spec(seed))

    try:
        async with anyio.create_task_group() as tg:
            for seed in seeds:
                tg.start_soon(one, seed)
    finally:
        await close_manager(manager)
    return [episodes[s] for s in seeds]


async def test_pull_and_push_agents_make_the_same_samples(tiny_tokenizer):
    """The same agent program, the same seeds, the scripted engine: push mode over loopback HTTP
    and pull mode over pipes from the sandbox give the same samples token for token."""
    engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.3)  # invalid answers: varied episode ends
    seeds = [0, 1, 2]
    runs = {}
    for runner, transport in (("push", "http"), ("pull", "inprocess")):
        rollout = RolloutConfig(env_id=ENV_ID, mode="proxy", manager=ManagerConfig(max_tokens=24), proxy=ProxyConfig(
            runner=runner, transport=transport, granularity="step",
            runner_kwargs={"command": AGENT, "timeout_s": 120}))
        runs[runner] = await play(make_manager(engine, rollout), seeds)
    push, pull = runs["push"], runs["pull"]
    for a, b in zip(push, pull, strict=True):
        assert a.trajectory.status == b.trajectory.status == "Finished", (a.trajectory.error, b.trajectory.error)
        assert a.trajectory.exit_reason == b.trajectory.exit_reason
        assert a.trajectory.episode_score == b.trajectory.episode_score
        assert [t.reward for t in a.trajectory.turns] == [t.reward for t in b.trajectory.turns]
        assert len(a.samples) == len(b.samples) > 0
        for x, y in zip(a.samples, b.samples, strict=True):
            assert x.input_ids == y.input_ids
            assert x.response_mask == y.response_mask
            assert x.old_logprobs == y.old_logprobs
            assert (x.step_score, x.state_key, x.step) == (y.step_score, y.state_key, y.step)
    assert {e.trajectory.exit_reason for e in pull} == {"terminated", "truncated"}  # not one trivial case
    assert sum(len(e.samples) for e in pull) > len(seeds)  # multi-turn episodes


async def test_stock_clients_over_the_pipes_in_the_sandbox(tiny_tokenizer):
    """Inside the sandbox: no network (when bwrap is in force), yet the stock sync and async openai
    clients work over the pipes, errors arrive as the openai exceptions, calls may overlap, and
    the agent can still run commands in a sandbox of its own (what a tool env does)."""
    listener = socket.create_server(("127.0.0.1", 0))  # a trainer-side service the agent must not reach
    port = listener.getsockname()[1]
    script = textwrap.dedent(f"""
        import asyncio, socket, httpx, openai
        from arl.agents.pipe_transport import AsyncPipeTransport, PipeTransport, end_session
        print("before the claim, no newline", end="")
        metrics = {{}}
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
            metrics["network"] = 1.0
        except OSError:
            metrics["network"] = 0.0
        sync = openai.OpenAI(max_retries=0, http_client=httpx.Client(transport=PipeTransport()))
        reply = sync.chat.completions.create(model="arl", messages=[{{"role": "user", "content": "hi"}}], max_tokens=8)
        metrics["sync_ok"] = float(reply.choices[0].message.role == "assistant")
        print("after the claim")
        try:
            sync.chat.completions.create(model="arl", messages=[{{"role": "robot", "content": "x"}}])
        except openai.BadRequestError as exc:
            metrics["bad_request"] = float(exc.status_code)
        metrics["models"] = float(sync.models.list().data[0].id == "arl")

        async def overlapping():
            http = openai.DefaultAsyncHttpxClient(transport=AsyncPipeTransport())
            async with openai.AsyncOpenAI(max_retries=0, http_client=http) as client:
                history = [{{"role": "user", "content": "hi"}}]
                calls = [client.chat.completions.create(model="arl", messages=history + [{{"role": "user", "content": str(i)}}],
                                                        max_tokens=8) for i in range(3)]
                return len(await asyncio.gather(*calls))

        metrics["async_calls"] = float(asyncio.run(overlapping()))

        async def tool_command():  # an agent's own tool sandbox nests inside this one
            from arl.sandbox.sandbox import Sandbox
            async with Sandbox(python=True) as sandbox:
                return (await sandbox.run("echo hi")).stdout == "hi\\n"

        metrics["tool_sandbox"] = float(asyncio.run(tool_command()))
        end_session({{"score": 1.0, "success": True, "metrics": metrics}})
    """)
    tracker = MessageTracker(tiny_tokenizer)
    handler = ChatHandler(ScriptedEngine(tiny_tokenizer), tracker)
    runner = PullModeRunner(responder(InProcessClient(handler, "episode-0")), [sys.executable, "-c", script],
                            timeout_s=120)
    with listener:
        result = await runner.run_job(0)
    assert (result.status, result.success) == ("Finished", True), result.error
    assert runner.isolation in ("bwrap", "none")
    assert result.metrics == {"network": 0.0 if runner.isolation == "bwrap" else 1.0, "sync_ok": 1.0,
                              "bad_request": 400.0, "models": 1.0, "async_calls": 3.0, "tool_sandbox": 1.0,
                              "isolated_uid": float(runner.tool_isolation == "uid")}
    assert runner.stats == {"requests": 6, "malformed_frames": 0}
    assert len(tracker.requests) == 4  # the 1 + 3 good calls reached the handler; the 400 and /models not
    assert handler.calls == 4


def answering(tokenizer):
    """A responder on a fresh episode handler (the scripted engine)."""
    return responder(InProcessClient(ChatHandler(ScriptedEngine(tokenizer), MessageTracker(tokenizer)), "e"))


async def test_agent_output_reaches_the_error_tail(tiny_tokenizer):
    """Output printed before and after the transport claims stdout ends up in ``error``."""
    script = textwrap.dedent("""
        import sys
        print("early words", end="")
        from arl.agents.pipe_transport import stdio_channel
        stdio_channel()
        print("late words")
        sys.exit(3)
    """)
    runner = PullModeRunner(answering(tiny_tokenizer), [sys.executable, "-c", script], timeout_s=60)
    result = await runner.run_job(0)
    assert (result.status, result.exit_reason) == ("Failed", "agent_error")
    assert "early words" in result.error and "late words" in result.error and "exited with 3" in result.error


def test_config_wiring(tiny_tokenizer):
    factory = make_runner_factory(ProxyConfig(runner="pull", runner_kwargs={"command": AGENT}))
    assert factory.func is pull_runner and factory.keywords == {"command": AGENT}  # a RunnerFactory
    with pytest.raises(ValueError, match="runner_kwargs.command"):
        make_runner_factory(ProxyConfig(runner="pull"))
    with pytest.raises(ValueError, match="transport=inprocess"):
        make_runner_factory(ProxyConfig(runner="pull", transport="http", runner_kwargs={"command": AGENT}))
    with pytest.raises(ValueError, match="InProcessClient"):
        responder(object())
    with pytest.raises(ValueError, match="sandbox"):
        PullModeRunner(answering(tiny_tokenizer), ["true"], timeout_s=1, sandbox="lxc")  # docker is a backend now (arl.sandbox.backends)


def test_transport_skips_noise_times_out_and_notices_a_gone_trainer():
    """The agent's transport alone, on two os.pipe()s, with a hand-written trainer thread."""
    import os
    import threading

    import httpx
    import openai

    from arl.agents.pipe_transport import PipeChannel, PipeTransport, header
    from arl.agents.pull import BASE_URL

    from_agent, agent_out = os.pipe()
    agent_in, to_agent = os.pipe()
    channel = PipeChannel(agent_in, agent_out)
    client = openai.OpenAI(base_url=BASE_URL, api_key="k", max_retries=0, timeout=0.5,
                           http_client=httpx.Client(transport=PipeTransport(channel)))
    frames = os.fdopen(from_agent, "rb")

    def trainer(answer: bool) -> None:
        fields = frames.readline().split()
        assert fields[:2] == [b"@arl-pull/1", b"req"] and fields[3:5] == [b"GET", b"/v1/models"]
        frames.read(int(fields[5]))
        if answer:  # noise first: a stray line and a response nobody waits for, then the real one
            body = b'{"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "x"}]}'
            os.write(to_agent, b"noise\n" + header("res", 999, 200, 2) + b"{}" + header("res", fields[2].decode(), 200,
                                                                                         len(body)) + body)

    for answer in (False, True):
        thread = threading.Thread(target=trainer, args=(answer,))
        thread.start()
        if answer:
            assert client.models.list().data[0].id == "m"
        else:
            with pytest.raises(openai.APITimeoutError):
                client.models.list()
        thread.join()
    os.close(to_agent)  # the trainer is gone
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
    frames.close()
