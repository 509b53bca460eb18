"""Engines never sample a VLM's vision tokens (issue 46): a sampled ``<|image_pad|>`` is an image slot
with no image, which no forward can score, so every backend serving a VLM forbids the four vision
tokens (vLLM ``bad_words``, HF a logit mask, scripted a refusal) and reports the log-probs of the
masked distribution, which the trainer scores with the same mask (arl.models.tiny_vl.mask_logits).

On a copy of the zoo's tiny-vl whose LM-head rows of ``<|image_pad|>`` and ``<|video_pad|>`` are
+-100 times one direction: at nearly every position one of them is by far the likeliest token, so
an engine that did not forbid them would sample them at once. vLLM under the `vllm` marker.
"""

from __future__ import annotations

import asyncio
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch

import arl.envs  # noqa: F401  (registers the ids)
from arl.engine import SamplingParams
from arl.engine.base import EngineError
from arl.engine.images import ImagePrompt
from arl.models.tiny_vl import MASKED_LOGIT, auto_model_class, mask_logits, vision_token_ids

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def eager_vl(tmp_path_factory) -> str:
    """tiny-vl, but wanting to say its vision tokens (module docstring)."""
    from transformers import AutoTokenizer

    from arl.models import resolve_model

    src = resolve_model("tiny-vl")
    dest = tmp_path_factory.mktemp("eager-vl") / "model"
    shutil.copytree(src, dest)
    tok = AutoTokenizer.from_pretrained(src)
    pad, video = tok.convert_tokens_to_ids("<|image_pad|>"), tok.convert_tokens_to_ids("<|video_pad|>")
    model = auto_model_class(src).from_pretrained(src, dtype=torch.float32)
    w = torch.nn.functional.normalize(torch.randn(model.config.text_config.hidden_size,
                                                  generator=torch.Generator().manual_seed(0)), dim=0)
    with torch.no_grad():  # tied: the input rows change too (image_pad's is replaced by image features, video_pad unused)
        model.get_output_embeddings().weight[pad] = 100 * w
        model.get_output_embeddings().weight[video] = -100 * w
    model.save_pretrained(dest)
    return str(dest)


def frame(seed: int = 0) -> np.ndarray:
    env = gym.make("arl/FrozenLake-v0").unwrapped
    env.reset(seed=seed)
    return env.frame()


def chat_ids(tokenizer, images: int = 1) -> list[int]:
    parts = [{"type": "image"}] * images + [{"type": "text", "text": "Where next?"}]
    out = tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def scored(model, rendered, completion: list[int]) -> list[float]:
    """The trainer's view: one forward over prompt + completion with the renderer's pixels."""
    inputs = rendered.model_inputs()
    n = len(rendered.input_ids)
    inputs["input_ids"] = torch.tensor([list(rendered.input_ids) + completion])
    inputs["mm_token_type_ids"] = torch.cat(
        [inputs["mm_token_type_ids"], torch.zeros((1, len(completion)), dtype=torch.long)], dim=1)
    with torch.no_grad():
        logits = model(**inputs).logits[0, n - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def hf_eager(eager_vl):
    from arl.engine.hf import HFEngine

    engine = HFEngine(eager_vl, max_model_len=512)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="module")
def unmasked(eager_vl):
    """The copy as transformers loads it, no mask: what an engine that did not forbid them would sample from."""
    return auto_model_class(eager_vl).from_pretrained(eager_vl, dtype=torch.float32).eval()


def test_the_copy_wants_its_vision_tokens(hf_eager, unmasked):
    forbidden = set(hf_eager.forbidden_token_ids)
    assert len(forbidden) == 4
    rendered = hf_eager.image_renderer.render(ImagePrompt(chat_ids(hf_eager.tokenizer), [frame()]))
    with torch.no_grad():
        logits = unmasked(**rendered.model_inputs()).logits[0, -1]
    assert int(logits.argmax()) in forbidden and float(torch.softmax(logits, -1)[list(forbidden)].sum()) > 0.99


def test_mask_logits_masks_every_forward_and_a_deep_copy(unmasked, hf_eager):
    import copy

    model = mask_logits(copy.deepcopy(unmasked), vision_token_ids(hf_eager.tokenizer))
    twin = copy.deepcopy(model)
    ids = torch.tensor([chat_ids(hf_eager.tokenizer, 0)])
    for m in (model, twin):
        with torch.no_grad():
            logits = m(input_ids=ids, logits_to_keep=2).logits
        assert (logits[..., list(hf_eager.forbidden_token_ids)] == MASKED_LOGIT).all()
        assert torch.isfinite(torch.log_softmax(logits, -1)).all()
    mask_logits(twin, [])  # replaced, on the copy only
    with torch.no_grad():
        assert not (twin(input_ids=ids).logits[..., list(hf_eager.forbidden_token_ids)] == MASKED_LOGIT).any()
        assert (model(input_ids=ids).logits[..., list(hf_eager.forbidden_token_ids)] == MASKED_LOGIT).all()


async def test_hf_never_samples_vision_tokens_and_reports_the_masked_distribution(hf_eager, unmasked):
    forbidden = set(hf_eager.forbidden_token_ids)
    prompt = ImagePrompt(chat_ids(hf_eager.tokenizer), [frame()])
    gens = await hf_eager.generate(prompt, SamplingParams(max_tokens=12, temperature=1.0, n=4, seed=1))
    greedy = await hf_eager.generate(prompt, SamplingParams(max_tokens=12, temperature=0))
    text = await hf_eager.generate(chat_ids(hf_eager.tokenizer, 0), SamplingParams(max_tokens=12, temperature=1.0, seed=2))
    for gen in [*gens, greedy, text]:
        assert len(gen.token_ids) > 0 and not forbidden & set(gen.token_ids)
    rendered = hf_eager.image_renderer.render(prompt)
    masked = mask_logits(unmasked, sorted(forbidden))  # what the trainer scores with (arl.train.trainer)
    try:
        assert np.allclose(scored(masked, rendered, list(greedy.token_ids)), greedy.logprobs, atol=1e-4)
    finally:
        mask_logits(unmasked, [])


async def test_scripted_refuses_a_script_with_vision_tokens(eager_vl):
    from transformers import AutoTokenizer

    from arl.engine.scripted import ScriptedEngine

    tok = AutoTokenizer.from_pretrained(eager_vl)
    engine = ScriptedEngine(tok, responses=["<answer>Left</answer><|image_pad|>"])
    with pytest.raises(EngineError, match="never samples its vision tokens"):
        await engine.generate(ImagePrompt(chat_ids(tok), [frame()]))
    ok = ScriptedEngine(tok, responses=["<answer>Left</answer>"])
    gen = await ok.generate(ImagePrompt(chat_ids(tok), [frame()]))
    assert not set(ok.forbidden_token_ids) & set(gen.token_ids) and len(ok.forbidden_token_ids) == 4


@pytest.mark.vllm
@pytest.mark.parametrize("backend", ["vllm", "vllm-async"])
async def test_vllm_never_samples_vision_tokens_and_agrees_with_hf(eager_vl, hf_eager, backend):
    from arl.engine.vllm import VLLMEngine
    from arl.engine.vllm_async import AsyncVLLMEngine

    cls = VLLMEngine if backend == "vllm" else AsyncVLLMEngine
    engine = cls(eager_vl, max_model_len=512, kv_cache_memory_bytes=64 * 2**20)
    try:
        forbidden = set(engine.forbidden_token_ids)
        assert forbidden == set(hf_eager.forbidden_token_ids) and len(engine.bad_words) == 4
        prompt = ImagePrompt(chat_ids(engine.tokenizer), [frame()])
        sampled = await engine.generate(prompt, SamplingParams(max_tokens=12, temperature=1.0, n=4, seed=1))
        greedy = await engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0))
        text = await engine.generate(chat_ids(engine.tokenizer, 0), SamplingParams(max_tokens=12, seed=2))
    finally:
        await engine.close()
    for gen in [*sampled, greedy, text]:
        assert len(gen.token_ids) > 0 and not forbidden & set(gen.token_ids)
    ref = await hf_eager.generate(prompt, SamplingParams(max_tokens=12, temperature=0))
    assert greedy.token_ids == ref.token_ids and np.allclose(greedy.logprobs, ref.logprobs, atol=1e-4)
