"""Sleep mode (engine.sleep_mode): the engine frees its GPU memory through the policy update.

vLLM's sleep mode is CUDA-only; on CPU the engine refuses to start with it. What arl adds around
vLLM's sleep()/wake_up() (hold new requests, let running ones finish, release the held ones on
wake, refuse weight loads while asleep) runs on CPU too: there the tests switch it on for an
engine started without it, and vLLM's CPU worker keeps its memory (it only warns) while its
scheduler pauses and resumes as on a GPU. On a GPU machine (scripts/gpu_check.sh) the same tests
start real sleep-mode engines.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import torch

from arl.config import ConfigError, EngineConfig, load_config
from arl.engine import EngineError, EngineUnsupportedError, SamplingParams, make_engine

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

CUDA = torch.cuda.is_available()
PROMPT = list(range(5, 40))
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def test_sleep_mode_needs_a_vllm_backend():
    with pytest.raises(ValueError, match="vLLM backend"):
        EngineConfig(backend="hf", sleep_mode=True)


def test_sleep_mode_and_overlap_exclude_each_other():
    with pytest.raises(ConfigError, match="exclude each other"):
        load_config(None, ["engine.sleep_mode=true", "rollout.max_staleness=1"])


@pytest.mark.skipif(CUDA, reason="on CUDA sleep mode starts")
def test_sleep_mode_on_cpu_is_refused_in_arls_words(tiny_path, tmp_path, capsys):
    with pytest.raises(EngineUnsupportedError, match="needs a CUDA GPU"):
        make_engine(backend="vllm", model="tiny", sleep_mode=True)
    from arl.cli import main

    assert main(["train", "tiny_frozenlake_gigpo", "engine.sleep_mode=true", f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "arl: engine.sleep_mode needs a CUDA GPU" in err and "Traceback" not in err


@contextlib.contextmanager
def sleep_capable(engine):
    """The session engine with arl's sleep path on (CPU: vLLM pauses but keeps its memory)."""
    engine.sleep_mode = True
    try:
        yield engine
    finally:
        engine.sleep_mode = False


@pytest.fixture(params=["vllm", "vllm-async"])
def sleepy_engine(request, tiny_path):
    if CUDA:  # a real sleep-mode engine
        engine = make_engine(backend=request.param, model="tiny", max_model_len=1024,
                             kv_cache_memory_bytes=64 * 2**20, sleep_mode=True)
        yield engine  # the test closes it, on its own event loop
        return
    session = request.getfixturevalue("vllm_engine" if request.param == "vllm" else "vllm_async_engine")
    with sleep_capable(session):
        yield session


async def test_sleep_waits_for_running_requests_and_holds_new_ones(sleepy_engine):
    engine = sleepy_engine
    try:
        before = await engine.generate(PROMPT, GREEDY)
        running = asyncio.create_task(
            engine.generate(PROMPT, SamplingParams(max_tokens=400, ignore_eos=True, seed=1)))
        await asyncio.sleep(0.05)
        await engine.sleep()
        assert engine.asleep
        assert running.done() and len(running.result().token_ids) == 400  # finished, not aborted
        held = asyncio.create_task(engine.generate(PROMPT, GREEDY))
        dropped = asyncio.create_task(engine.generate(PROMPT, GREEDY))
        await asyncio.sleep(0.3)
        assert not held.done()  # waits for wake()
        dropped.cancel()  # a caller may give up while its request is held
        with pytest.raises(EngineError, match="asleep"):
            await engine.update_weights([])
        await engine.wake()
        assert not engine.asleep
        after = await asyncio.wait_for(held, timeout=60)
        assert after.token_ids == before.token_ids  # same weights after the round trip
        assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)
        with pytest.raises(asyncio.CancelledError):
            await dropped
        again = await asyncio.wait_for(engine.generate(PROMPT, GREEDY), timeout=60)
        assert again.token_ids == before.token_ids
    finally:
        await engine.wake()
        if CUDA:
            await engine.close()


async def test_sleep_and_wake_are_idempotent_and_noops_without_sleep_mode(vllm_engine):
    await vllm_engine.sleep()  # started without sleep mode: nothing happens
    assert not vllm_engine.asleep
    await vllm_engine.wake()
    assert (await vllm_engine.generate(PROMPT, GREEDY)).token_ids
    with sleep_capable(vllm_engine):
        await vllm_engine.sleep()
        await vllm_engine.sleep()
        assert vllm_engine.asleep
        await vllm_engine.wake()
        await vllm_engine.wake()
        assert not vllm_engine.asleep
    assert (await asyncio.wait_for(vllm_engine.generate(PROMPT, GREEDY), timeout=60)).token_ids


async def test_close_while_asleep_fails_the_held_requests(tiny_path):
    engine = make_engine(backend="vllm", model="tiny", max_model_len=512, kv_cache_memory_bytes=32 * 2**20,
                         sleep_mode=CUDA)
    engine.sleep_mode = True
    await engine.sleep()
    held = asyncio.create_task(engine.generate(PROMPT, GREEDY))
    await asyncio.sleep(0.1)
    await engine.close()
    with pytest.raises(EngineError):
        await asyncio.wait_for(held, timeout=30)
