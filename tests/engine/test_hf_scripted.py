"""HFEngine and ScriptedEngine checks (the shared contract suite lives in test_contract.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from arl.config import EngineConfig
from arl.engine import EngineClosedError, EngineError, SamplingParams, make_engine
from arl.engine.hf import HFEngine, _top_k_top_p
from arl.engine.scripted import INVALID_ANSWERS, ScriptedEngine
from arl.models import resolve_model

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


@pytest.fixture(scope="module")
def tiny() -> str:
    return resolve_model("tiny")


@pytest.fixture(scope="module")
def hf(tiny: str):
    engine = HFEngine(tiny, max_model_len=256, seed=0)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="module")
def prompts(hf: HFEngine) -> list[list[int]]:
    tok = hf.tokenizer
    texts = [
        "Turn 1:\nObservation:\n#####\n#P_O#\n#####\n",
        "You are solving the Sokoban puzzle.",
        "Up",
        "<answer>Left</answer> reward 1 2 3",
    ]
    chats = [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        for t in texts
    ]
    return [tok.encode(c, add_special_tokens=False) for c in chats] + [[5, 6, 7], [100] * 40]


def gather(engine, cases):
    async def main():
        return await asyncio.gather(*[engine.generate(p, sp) for p, sp in cases])

    return asyncio.run(main())


def sequential(engine, cases):
    async def main():
        return [await engine.generate(p, sp) for p, sp in cases]

    return asyncio.run(main())


def fresh_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens of a plain transformers model, one unpadded sequence, no cache tricks."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(max_tokens):
            nxt = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist()


# -- HFEngine ----------------------------------------------------------------------------------------
def test_batched_equals_one_at_a_time(hf, prompts):
    cases = [(p, GREEDY) for p in prompts]
    batched, single = gather(hf, cases), sequential(hf, cases)
    for b, s in zip(batched, single, strict=True):
        assert b.token_ids == s.token_ids
        assert b.logprobs == pytest.approx(s.logprobs, abs=1e-5)
        assert len(b.logprobs) == len(b.token_ids) and all(lp <= 0 for lp in b.logprobs)


def test_greedy_matches_plain_transformers(hf, prompts):
    gens = gather(hf, [(p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)) for p in prompts])
    for p, g in zip(prompts, gens, strict=True):
        assert g.token_ids == fresh_greedy(hf.model, p, 12)


def test_seeded_sampling_is_reproducible_and_batch_independent(hf, prompts):
    sp = SamplingParams(max_tokens=20, temperature=1.0, top_k=50, top_p=0.95, seed=1234)
    alone = sequential(hf, [(prompts[0], sp)])[0]
    crowd = gather(hf, [(p, SamplingParams(max_tokens=30, temperature=0.7, seed=i)) for i, p in enumerate(prompts)]
                   + [(prompts[0], sp)])[-1]
    assert crowd.token_ids == alone.token_ids
    assert crowd.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other = sequential(hf, [(prompts[0], attrs_evolve(sp, seed=4321))])[0]
    assert other.token_ids != alone.token_ids


def attrs_evolve(sp: SamplingParams, **kw) -> SamplingParams:
    import attrs

    return attrs.evolve(sp, **kw)


def test_unseeded_requests_follow_the_engine_seed(tiny, prompts):
    sp = SamplingParams(max_tokens=16, temperature=1.0)
    runs = []
    for _ in range(2):
        engine = HFEngine(tiny, max_model_len=256, seed=7)
        runs.append([g.token_ids for g in sequential(engine, [(p, sp) for p in prompts[:3]])])
        asyncio.run(engine.close())
    assert runs[0] == runs[1]


def test_n_children_use_consecutive_seeds(hf, prompts):
    sp = SamplingParams(max_tokens=16, temperature=1.0, seed=50, n=3)
    gens = sequential(hf, [(prompts[1], sp)])[0]
    assert isinstance(gens, list) and len(gens) == 3
    singles = sequential(hf, [(prompts[1], attrs_evolve(sp, n=1, seed=50 + i)) for i in range(3)])
    assert [g.token_ids for g in gens] == [s.token_ids for s in singles]
    assert len({tuple(g.token_ids) for g in gens}) > 1


def test_processed_logprobs_are_those_of_the_truncated_distribution(hf, prompts):
    sp = SamplingParams(max_tokens=10, temperature=0.7, top_k=30, top_p=0.8, seed=3, ignore_eos=True)
    gen = sequential(hf, [(prompts[0], sp)])[0]
    ids = torch.tensor([prompts[0] + gen.token_ids])
    with torch.inference_mode():
        logits = hf.model(input_ids=ids).logits[0, len(prompts[0]) - 1: -1].float()
    for pos, (tok, lp) in enumerate(zip(gen.token_ids, gen.logprobs, strict=True)):
        x = _top_k_top_p(logits[pos] / 0.7, 30, 0.8)
        assert torch.isfinite(x).sum() <= 30  # the sampled token survived truncation
        assert lp == pytest.approx(float(torch.log_softmax(x, -1)[tok]), abs=1e-5)


def test_top_k_top_p_rules():
    x = torch.tensor([3.0, 2.0, 2.0, 1.0, 0.0])
    assert torch.isfinite(_top_k_top_p(x, 2, 1.0)).tolist() == [True, True, True, False, False]  # ties kept
    probs = torch.softmax(x, -1)  # [.53, .20, .20, .07, .03]
    kept = torch.isfinite(_top_k_top_p(x, 0, 0.6)).tolist()
    assert kept[0] and sum(kept) == 2 and probs[0] < 0.6  # smallest set with mass >= p
    assert torch.isfinite(_top_k_top_p(x, 0, 0.01)).sum() == 1
    assert torch.equal(_top_k_top_p(x, 0, 1.0), x)


def test_stop_and_length(hf, prompts):
    first = sequential(hf, [(prompts[0], GREEDY)])[0]
    stop_tok = first.token_ids[2]
    stopped = sequential(hf, [(prompts[0], attrs_evolve(GREEDY, stop_token_ids=(stop_tok,)))])[0]
    cut = first.token_ids.index(stop_tok) + 1
    assert stopped.finish_reason == "stop" and stopped.token_ids == first.token_ids[:cut]
    short = sequential(hf, [(prompts[0], attrs_evolve(GREEDY, max_tokens=3))])[0]
    assert short.finish_reason == "length" and short.token_ids == first.token_ids[:3]
    near_end = [5] * (hf.max_model_len - 4)  # the context leaves room for 4 tokens
    clipped = sequential(hf, [(near_end, SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))])[0]
    assert clipped.finish_reason == "length" and len(clipped.token_ids) == 4


def test_eos_stops_and_is_kept(hf):
    eos = hf.tokenizer.eos_token_id
    # Sample until some request ends on EOS (random tiny model: EOS is one of ~1000 tokens).
    sp = SamplingParams(max_tokens=200, temperature=1.5)
    gens = gather(hf, [([7, 8, 9], attrs_evolve(sp, seed=s)) for s in range(16)])
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert stopped, "no sample hit EOS"
    for g in stopped:
        assert g.token_ids[-1] == eos and eos not in g.token_ids[:-1]
    for g in gens:
        if g.finish_reason == "length":
            assert len(g.token_ids) == 200 and eos not in g.token_ids


def test_cancellation_does_not_wedge(hf, prompts):
    async def main():
        long = SamplingParams(max_tokens=200, temperature=1.0, ignore_eos=True)
        running = asyncio.create_task(hf.generate(prompts[0], long))
        await asyncio.sleep(0.05)  # the batch is running
        queued = asyncio.create_task(hf.generate(prompts[1], long))
        await asyncio.sleep(0)
        running.cancel()
        queued.cancel()
        for task in (running, queued):
            with pytest.raises(asyncio.CancelledError):
                await task
        return await asyncio.wait_for(hf.generate(prompts[2], GREEDY), timeout=60)

    assert asyncio.run(main()).token_ids


def test_batch_error_fails_requests_not_the_worker(tiny, prompts):
    engine = HFEngine(tiny, max_model_len=256)

    async def main():
        original = engine.model.forward
        engine.model.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
        with pytest.raises(EngineError, match="boom"):
            await engine.generate(prompts[0], GREEDY)
        engine.model.forward = original
        gen = await engine.generate(prompts[0], GREEDY)
        await engine.close()
        return gen

    assert asyncio.run(main()).token_ids


def test_update_weights_matches_a_fresh_model(tiny, prompts):
    from transformers import AutoModelForCausalLM

    engine = HFEngine(tiny, max_model_len=256)
    ref = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    # named_parameters() lists the tied embedding once (as embed_tokens): lm_head must follow it.
    new = {n: p.detach() + 0.05 * torch.randn(p.shape, generator=gen) for n, p in ref.named_parameters()}
    assert "lm_head.weight" not in new
    ref.load_state_dict(new, strict=False)
    assert torch.equal(ref.lm_head.weight, new["model.embed_tokens.weight"])

    async def main():
        before = await engine.generate(prompts[0], GREEDY)
        await engine.update_weights(new.items())
        after = await engine.generate(prompts[0], GREEDY)
        with pytest.raises(EngineError, match="not in the model"):
            await engine.update_weights([("model.nope.weight", torch.zeros(1))])
        emb = new["model.embed_tokens.weight"]
        with pytest.raises(EngineError, match="tied"):
            await engine.update_weights([("model.embed_tokens.weight", emb), ("lm_head.weight", emb + 1)])
        with pytest.raises(EngineError, match="shape"):
            await engine.update_weights([("model.norm.weight", torch.zeros(3))])
        await engine.close()
        return before, after

    before, after = asyncio.run(main())
    assert before.policy_version == 0 and after.policy_version == 1
    assert torch.equal(engine.model.lm_head.weight, new["model.embed_tokens.weight"])
    assert after.token_ids == fresh_greedy(ref, prompts[0], len(after.token_ids))
    assert after.token_ids != before.token_ids


def test_close_leaves_no_threads_and_rejects_work(tiny, prompts):
    before = set(threading.enumerate())
    engine = HFEngine(tiny, max_model_len=256)

    async def main():
        running = asyncio.create_task(
            engine.generate(prompts[0], SamplingParams(max_tokens=200, ignore_eos=True))
        )
        await asyncio.sleep(0.05)
        await engine.close()
        with pytest.raises(EngineError):
            await running
        with pytest.raises(EngineClosedError):
            await engine.generate(prompts[0], GREEDY)

    asyncio.run(main())
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("arl-hf")]


def test_make_engine_builds_hf():
    engine = make_engine(EngineConfig(backend="hf", max_model_len=128, max_batch_size=4))
    assert isinstance(engine, HFEngine) and engine.max_batch_size == 4 and engine.max_model_len == 128
    gens = gather(engine, [([5 + i, 6], GREEDY) for i in range(9)])  # 3 batches of <= 4 sequences
    assert all(g.token_ids for g in gens)
    asyncio.run(engine.close())


@pytest.mark.vllm
def test_greedy_matches_vllm(hf, prompts):
    vllm = make_engine(backend="vllm", max_model_len=256)
    try:
        cases = [(p, SamplingParams(max_tokens=40, temperature=0.0)) for p in prompts]
        sampled = [(p, SamplingParams(max_tokens=20, temperature=0.8, top_k=40, top_p=0.9, seed=i))
                   for i, p in enumerate(prompts)]
        v = gather(vllm, cases + sampled)
    finally:
        asyncio.run(vllm.close())
    h = gather(hf, cases)
    worst = 0.0
    for a, b in zip(h, v[: len(cases)], strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        worst = max(worst, max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)))
    assert worst < 1e-4
    # vLLM's CPU sampler draws different noise, so seeded samples differ across backends; the
    # processed log-probs must still agree: score vLLM's samples under our sampler's distribution.
    for (p, sp), g in zip(sampled, v[len(cases):], strict=True):
        ids = torch.tensor([p + g.token_ids])
        with torch.inference_mode():
            logits = hf.model(input_ids=ids).logits[0, len(p) - 1: -1].float()
        ours = [float(torch.log_softmax(_top_k_top_p(logits[i] / sp.temperature, sp.top_k, sp.top_p), -1)[t])
                for i, t in enumerate(g.token_ids)]
        assert ours == pytest.approx(g.logprobs, abs=1e-4)


# -- ScriptedEngine ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tiny: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


def test_scripted_is_deterministic_under_concurrency(tokenizer):
    from arl.envs import parse_answer

    engine = ScriptedEngine(tokenizer, invalid_rate=0.3, seed=5, latency_s=0.001)
    cases = [([10 + i, 11, 12], SamplingParams(seed=i % 3)) for i in range(40)]
    a = gather(engine, cases)
    b = sequential(engine, list(reversed(cases)))[::-1]
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    texts = [tokenizer.decode(g.token_ids[:-1]) for g in a]
    valid = [parse_answer(t, ["Up", "Down", "Left", "Right"]) for t in texts]
    assert 0 < valid.count(None) < len(valid)
    assert all(t in INVALID_ANSWERS for t, v in zip(texts, valid, strict=True) if v is None)
    assert len({v for v in valid if v}) > 1
    for g in a:
        assert g.finish_reason == "stop" and g.token_ids[-1] == tokenizer.eos_token_id
        assert len(g.logprobs) == len(g.token_ids) and all(-3.1 < lp <= 0 for lp in g.logprobs)
    other_seed = ScriptedEngine(tokenizer, invalid_rate=0.3, seed=6)
    assert [g.token_ids for g in gather(other_seed, cases)] != [g.token_ids for g in a]


def test_scripted_responses_and_truncation(tokenizer):
    engine = ScriptedEngine(tokenizer, responses=["<answer>Up</answer>", "hello world"], logprob=-0.5)
    a, b, c = sequential(engine, [([1, 2], SamplingParams())] * 3)
    assert tokenizer.decode(a.token_ids, skip_special_tokens=True) == "<answer>Up</answer>"
    assert tokenizer.decode(b.token_ids, skip_special_tokens=True) == "hello world"
    assert c.token_ids == a.token_ids and a.logprobs == [-0.5] * len(a.token_ids)
    short = sequential(engine, [([1, 2], SamplingParams(max_tokens=2))])[0]
    assert short.finish_reason == "length" and len(short.token_ids) == 2
    no_eos = sequential(engine, [([1, 2], SamplingParams(ignore_eos=True))])[0]
    assert tokenizer.eos_token_id not in no_eos.token_ids and no_eos.finish_reason == "length"

    echo = ScriptedEngine(tokenizer, responses=lambda text: f"<answer>{'Up' if 'Up' in text else 'Down'}</answer>")
    up = tokenizer.encode("Up", add_special_tokens=False)
    gens = sequential(echo, [(up, SamplingParams()), ([5], SamplingParams(n=2))])
    assert tokenizer.decode(gens[0].token_ids, skip_special_tokens=True) == "<answer>Up</answer>"
    assert [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens[1]] == ["<answer>Down</answer>"] * 2


def test_scripted_stop_token_inside_text(tokenizer):
    up = tokenizer.convert_tokens_to_ids("Up")
    engine = ScriptedEngine(tokenizer, actions=("Up",))
    gen = sequential(engine, [([3], SamplingParams(stop_token_ids=(up,)))])[0]
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == up and len(gen.token_ids) == 2


def test_scripted_failures_updates_and_config():
    engine = make_engine(backend="scripted", seed=1, scripted={"fail_rate": 0.5, "actions": ["Left"]})
    assert isinstance(engine, ScriptedEngine) and engine.actions == ("Left",)

    async def main():
        outcomes = []
        for i in range(20):
            try:
                await engine.generate([i + 1], SamplingParams())
                outcomes.append(True)
            except EngineError:
                outcomes.append(False)
        await engine.update_weights([("a", torch.zeros(1)), ("b", torch.zeros(2))])
        return outcomes

    first, second = asyncio.run(main()), None
    engine2 = make_engine(backend="scripted", seed=1, scripted={"fail_rate": 0.5, "actions": ["Left"]})
    second = [
        not isinstance(r, EngineError)
        for r in asyncio.run(_gather_exc(engine2, [[i + 1] for i in range(20)]))
    ]
    assert first == second and 0 < sum(first) < 20
    assert engine.policy_version == 1 and engine.tensors_received == 2 and engine.weight_updates == 1
    with pytest.raises(ValueError, match="unknown scripted option"):
        make_engine(backend="scripted", scripted={"bogus": 1})


async def _gather_exc(engine, prompts):
    return await asyncio.gather(*[engine.generate(p, SamplingParams()) for p in prompts], return_exceptions=True)
