"""Scratch checks of the `vllm-async` backend (AsyncLLM, engine core in a child process).

One engine serves the module; every test drives it from its own `asyncio.run` loop, which also
checks that the engine is not bound to one caller loop. The last test closes it.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psutil
import pytest

pytest.importorskip("vllm")

from arl.engine import EngineClosedError, EngineError, Generation, SamplingParams, make_engine  # noqa: E402
from arl.engine.base import InvalidPromptError  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 17, 99, 3], [1, 2, 3, 4, 5, 6, 7, 8], [300, 12]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
TIMINGS: dict[str, float] = {}


def child_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


BEFORE: set[int] = set()  # children that existed before this module's engine (other fixtures')


@pytest.fixture(scope="module")
def engine():
    BEFORE.update(child_pids())
    t0 = time.perf_counter()
    eng = make_engine(backend="vllm-async", model="tiny", max_model_len=512)
    TIMINGS["startup_s"] = time.perf_counter() - t0
    yield eng
    asyncio.run(eng.close())
    print("\nvllm-async timings:", {k: round(v, 4) for k, v in TIMINGS.items()})


@pytest.fixture(scope="module")
def hf_model():
    import torch
    from transformers import AutoModelForCausalLM

    from arl.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), dtype=torch.float32).eval()


def hf_greedy(model, prompt: list[int], max_tokens: int, eos: int | None = None):
    """Greedy token ids and their log-probs from a transformers model (fp32 reference)."""
    import torch

    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            tok = int(lp.argmax())
            ids.append(tok)
            lps.append(float(lp[tok]))
            if tok == eos:
                break
    return ids[len(prompt):], lps


def run(coro):
    return asyncio.run(coro)


def check_generation(g: Generation, prompt_len: int) -> None:
    assert isinstance(g, Generation)
    assert len(g.token_ids) == len(g.logprobs) >= 1
    assert all(lp <= 0.0 for lp in g.logprobs)
    assert g.prompt_len == prompt_len
    assert g.finish_reason in ("stop", "length")


def test_tokens_and_one_logprob_per_token(engine):
    g = run(engine.generate(PROMPTS[0], GREEDY))
    check_generation(g, len(PROMPTS[0]))
    assert len(g.token_ids) == 12 and g.finish_reason == "length"
    assert g.policy_version == engine.policy_version
    t0 = time.perf_counter()
    long = run(engine.generate(PROMPTS[0], SamplingParams(max_tokens=128, ignore_eos=True)))
    TIMINGS["tokens_per_s_1x128"] = len(long.token_ids) / (time.perf_counter() - t0)


def test_n_completions(engine):
    gs = run(engine.generate(PROMPTS[1], SamplingParams(max_tokens=8, n=4, seed=3)))
    assert isinstance(gs, list) and len(gs) == 4
    for g in gs:
        check_generation(g, len(PROMPTS[1]))
    assert len({tuple(g.token_ids) for g in gs}) > 1  # sampled, not copies


def test_stop_at_max_tokens_and_at_stop_token(engine):
    g = run(engine.generate(PROMPTS[0], GREEDY))
    stop = g.token_ids[4]
    first = g.token_ids.index(stop)
    s = run(engine.generate(PROMPTS[0], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop,))))
    assert s.finish_reason == "stop"
    assert s.token_ids == g.token_ids[: first + 1]  # the stop token is kept
    one = run(engine.generate(PROMPTS[0], SamplingParams(max_tokens=1, temperature=0.0)))
    assert one.finish_reason == "length" and one.token_ids == g.token_ids[:1]


def test_stop_at_eos(engine, hf_model):
    """Find (with transformers) a prompt whose greedy continuation reaches EOS, then check vLLM."""
    import torch

    eos = engine.tokenizer.eos_token_id
    steps = 10
    with torch.no_grad():  # every one-token prompt, greedily rolled out `steps` tokens at once
        ids = torch.arange(engine.vocab_size).unsqueeze(1)
        for _ in range(steps):
            ids = torch.cat([ids, hf_model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    hits = (ids[:, 1:] == eos).any(1).nonzero().flatten().tolist()
    if not hits:
        pytest.skip("no one-token prompt reaches EOS greedily within 10 tokens")
    prompt = [hits[0]]
    g = run(engine.generate(prompt, SamplingParams(max_tokens=steps + 5, temperature=0.0)))
    ref, _ = hf_greedy(hf_model, prompt, steps + 5, eos=eos)
    assert g.finish_reason == "stop" and g.token_ids[-1] == eos
    assert g.token_ids == ref
    cont = run(engine.generate(prompt, SamplingParams(max_tokens=steps + 5, temperature=0.0, ignore_eos=True)))
    assert cont.finish_reason == "length" and len(cont.token_ids) == steps + 5


def test_seed_reproducible(engine):
    p = SamplingParams(max_tokens=16, temperature=1.0, seed=1234)

    async def go():
        return await asyncio.gather(
            engine.generate(PROMPTS[2], p), engine.generate(PROMPTS[2], p),
            engine.generate(PROMPTS[2], SamplingParams(max_tokens=16, temperature=1.0, seed=99)),
        )

    a, b, c = run(go())
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
    assert a.token_ids != c.token_ids
    again = run(engine.generate(PROMPTS[2], p))  # another loop, later, batched differently
    assert again.token_ids == a.token_ids


def test_concurrent_requests(engine):
    async def go():
        t0 = time.perf_counter()
        gens = await asyncio.gather(*[
            engine.generate(PROMPTS[i % 3], SamplingParams(max_tokens=32, seed=i, ignore_eos=True))
            for i in range(16)
        ])
        return gens, time.perf_counter() - t0

    gens, dt = run(go())
    assert len(gens) == 16
    for g in gens:
        check_generation(g, g.prompt_len)
        assert len(g.token_ids) == 32
    TIMINGS["tokens_per_s_16x32"] = 16 * 32 / dt


def test_invalid_prompt(engine):
    with pytest.raises(InvalidPromptError):
        run(engine.generate([engine.vocab_size + 5], GREEDY))
    with pytest.raises(InvalidPromptError):
        run(engine.generate([], GREEDY))


def test_vllm_errors_are_typed():
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    from arl.engine.vllm_async import _translate

    wrapped = EngineGenerateError()
    wrapped.__cause__ = ValueError("token id 5000 out of vocabulary")
    assert isinstance(_translate(wrapped), InvalidPromptError)
    assert isinstance(_translate(VLLMValidationError("bad")), InvalidPromptError)
    dead = _translate(EngineDeadError())
    assert isinstance(dead, EngineError) and not isinstance(dead, InvalidPromptError)


def test_chunk_state():
    import torch

    from arl.engine.vllm_async import chunk_state

    state = [(f"w{i}", torch.zeros(10)) for i in range(5)]  # 40 bytes each
    assert [len(c) for c in chunk_state(state, 100)] == [2, 2, 1]
    assert [len(c) for c in chunk_state(state, 10)] == [1, 1, 1, 1, 1]  # oversized: one per chunk
    assert list(chunk_state([], 100)) == []


def test_cancel_aborts_and_does_not_wedge(engine):
    async def count() -> int:
        return engine.llm.get_num_unfinished_requests()

    async def go():
        long = asyncio.create_task(
            engine.generate(PROMPTS[0], SamplingParams(max_tokens=400, ignore_eos=True))
        )
        await asyncio.sleep(0.3)
        assert await engine.on_engine_loop(count()) == 1  # in flight
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        for _ in range(100):  # the abort reaches vLLM's output processor
            if await engine.on_engine_loop(count()) == 0:
                break
            await asyncio.sleep(0.05)
        assert await engine.on_engine_loop(count()) == 0
        return await asyncio.wait_for(engine.generate(PROMPTS[0], GREEDY), 60)

    g = run(go())
    check_generation(g, len(PROMPTS[0]))


def test_greedy_matches_inprocess_vllm(engine):
    async def both():
        ref = make_engine(backend="vllm", model="tiny", max_model_len=512)
        try:
            r = [await ref.generate(p, GREEDY) for p in PROMPTS]
        finally:
            await ref.close()
        a = [await engine.generate(p, GREEDY) for p in PROMPTS]
        return r, a

    refs, outs = run(both())
    for r, a in zip(refs, outs, strict=True):
        assert a.token_ids == r.token_ids
        assert a.logprobs == pytest.approx(r.logprobs, abs=1e-4)


def test_update_weights_matches_transformers(engine, hf_model):
    import torch

    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    gen = torch.Generator().manual_seed(7)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    # the tiny model ties lm_head to the embedding: keep the tie in the new state
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]
    before = run(engine.generate(PROMPTS[0], GREEDY))
    version = engine.policy_version

    engine.weight_chunk_bytes = 200_000  # several safetensors chunks staged in the worker
    try:
        run(engine.update_weights(perturbed.items()))
    finally:
        engine.weight_chunk_bytes = 256 * 2**20
    assert engine.policy_version == version + 1
    try:
        hf_model.load_state_dict(perturbed)
        for p in PROMPTS:
            g = run(engine.generate(p, GREEDY))
            ids, lps = hf_greedy(hf_model, p, GREEDY.max_tokens)
            assert g.token_ids == ids
            assert g.logprobs == pytest.approx(lps, abs=1e-4)
            assert g.policy_version == version + 1
        assert run(engine.generate(PROMPTS[0], GREEDY)).token_ids != before.token_ids
    finally:  # restore, so the module engine and reference model serve the original weights
        hf_model.load_state_dict(original)
        t0 = time.perf_counter()
        run(engine.update_weights(original.items()))  # one chunk
        TIMINGS["update_weights_s"] = time.perf_counter() - t0
    assert run(engine.generate(PROMPTS[0], GREEDY)).token_ids == before.token_ids


def test_close_fails_inflight_and_leaves_no_process(engine):
    """Runs last: closes the module engine, then builds one inside a running loop and closes it."""
    # other fixtures' engines (e.g. the session hf engine's worker) may hold threads of their own
    threads_before = {t.ident for t in threading.enumerate() if not t.daemon or t.name == "arl-vllm-async-loop"}
    threads_before.discard(getattr(engine, "_thread", None) and engine._thread.ident)

    async def close_while_running():
        long = asyncio.create_task(
            engine.generate(PROMPTS[0], SamplingParams(max_tokens=400, ignore_eos=True))
        )
        await asyncio.sleep(0.3)
        await engine.close()
        with pytest.raises(EngineError):
            await long
        with pytest.raises(EngineClosedError):
            await engine.generate(PROMPTS[0], GREEDY)

    run(close_while_running())
    assert child_pids() <= BEFORE

    async def inside_loop():
        t0 = time.perf_counter()
        eng = make_engine(backend="vllm-async", model="tiny", max_model_len=512)
        TIMINGS["startup_in_loop_s"] = time.perf_counter() - t0
        async with eng:
            check_generation(await eng.generate(PROMPTS[1], GREEDY), len(PROMPTS[1]))

    run(inside_loop())
    assert child_pids() <= BEFORE
    ours = [t for t in threading.enumerate() if t.name == "arl-vllm-async-loop" and t.ident not in threads_before]
    assert ours == []
    assert [t for t in threading.enumerate() if not t.daemon and t.ident not in threads_before] == []
