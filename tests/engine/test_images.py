"""Image prompts (issue 46 items 3 and 5): the engine's expanded ids are the renderer's and the
processor's, its log-probs the trainer's forward's, and bad input gets a typed error.

The vLLM tests carry the `vllm` marker; the HF and scripted ones run everywhere. All on the zoo's
tiny-vl (random init: agreement, not quality, is what is checked).
"""

from __future__ import annotations

import asyncio
import base64
import doctest
import io

import gymnasium as gym
import numpy as np
import pytest

import arl.envs  # noqa: F401  (registers the ids)
from arl.engine import SamplingParams
from arl.engine import images as images_module
from arl.engine.base import InvalidPromptError, PromptTooLongError
from arl.engine.images import (
    ImagePrompt,
    ImageRenderer,
    NoVisionTowerError,
    TooManyImagesError,
    UnreadableImageError,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def renderer(vl_path) -> ImageRenderer:
    return ImageRenderer(vl_path)


@pytest.fixture(scope="module")
def hf_vl(vl_path):
    """tests/conftest.py's, at a 512-token context (the too-many-images test names it)."""
    from arl.engine.hf import HFEngine

    engine = HFEngine(vl_path, max_model_len=512)
    yield engine
    asyncio.run(engine.close())


def frame(env_id: str = "arl/FrozenLake-v0", seed: int = 0) -> np.ndarray:
    env = gym.make(env_id).unwrapped
    env.reset(seed=seed)
    return env.frame()


def chat_ids(tokenizer, n_images: int = 1, text: str = "Where next?") -> list[int]:
    parts = [{"type": "text", "text": text}] + [{"type": "image"}] * n_images
    out = tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def chat_text(tokenizer, n_images: int = 1, text: str = "Where next?") -> str:
    parts = [{"type": "text", "text": text}] + [{"type": "image"}] * n_images
    return tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True)


def trainer_logprobs(model, rendered, completion: list[int]) -> list[float]:
    """What a trainer computes: one forward over prompt + completion with the renderer's pixels."""
    import torch

    inputs = rendered.model_inputs()
    n = len(rendered.input_ids)
    inputs["input_ids"] = torch.tensor([list(rendered.input_ids) + completion])
    inputs["mm_token_type_ids"] = torch.cat(
        [inputs["mm_token_type_ids"], torch.zeros((1, len(completion)), dtype=torch.long)], dim=1)
    with torch.no_grad():
        logits = model(**inputs).logits[0, n - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def test_doctests():
    failures, tried = doctest.testmod(images_module)
    assert tried >= 2 and failures == 0


# -- the renderer ------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id, cells", [("arl/FrozenLake-v0", 16), ("arl/Sokoban-v0", 36)])
def test_one_image_token_per_cell(renderer, env_id, cells):
    assert renderer.tokens_per_image(frame(env_id)) == cells


def test_renderer_ids_and_pixels_are_the_processors(renderer):
    """Token-in expansion == the processor's own text-level expansion, pixels byte-identical."""
    tok = renderer.processor.tokenizer
    frames = [frame(), frame("arl/Sokoban-v0", 3)]
    rendered = renderer.render(ImagePrompt(chat_ids(tok, 2), frames))
    out = renderer.processor(text=[chat_text(tok, 2)], images=frames, return_tensors="np")
    assert list(rendered.input_ids) == out["input_ids"][0].tolist()
    assert rendered.pixel_values.tobytes() == np.ascontiguousarray(out["pixel_values"], np.float32).tobytes()
    assert rendered.image_grid_thw.tolist() == out["image_grid_thw"].tolist()
    assert int(rendered.image_token_mask.sum()) == 16 + 36


def test_every_image_form_gives_the_same_pixels(renderer):
    from PIL import Image

    img = frame()
    png = io.BytesIO()
    Image.fromarray(img).save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    ids = chat_ids(renderer.processor.tokenizer)
    pixels = {renderer.render(ImagePrompt(ids, [form])).pixel_values.tobytes()
              for form in (img, Image.fromarray(img), png.getvalue(), url)}
    assert len(pixels) == 1


@pytest.mark.parametrize("bad", [b"not an image", "hello", np.zeros((4, 4), np.float32),
                                 "data:image/png;base64,@@@", object()])
def test_unreadable_images_are_typed(renderer, bad):
    with pytest.raises(UnreadableImageError):
        renderer.render(ImagePrompt(chat_ids(renderer.processor.tokenizer), [bad]))


def test_placeholders_must_pair_with_images(renderer):
    ids = chat_ids(renderer.processor.tokenizer, 1)
    with pytest.raises(InvalidPromptError, match="placeholder"):
        renderer.render(ImagePrompt(ids, [frame(), frame()]))
    expanded = renderer.render(ImagePrompt(ids, [frame()])).input_ids
    with pytest.raises(InvalidPromptError, match="placeholder"):  # already expanded: not accepted twice
        renderer.render(ImagePrompt(expanded, [frame()]))


def test_text_model_has_no_renderer(tiny_path):
    with pytest.raises(NoVisionTowerError):
        ImageRenderer(tiny_path)


# -- the scripted engine (fake pixels) ----------------------------------------------------------------
async def test_scripted_takes_images_with_fake_pixels(vl_path, tiny_tokenizer):
    from transformers import AutoTokenizer

    from arl.engine.scripted import ScriptedEngine

    tok = AutoTokenizer.from_pretrained(vl_path)
    engine = ScriptedEngine(tok, image_tokens=3)
    ids = chat_ids(tok)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    gen = await engine.generate(ImagePrompt(ids, [frame()]), SamplingParams(max_tokens=16))
    assert gen.prompt_token_ids.count(pad) == 3 and gen.prompt_len == len(ids) + 2
    other = [await engine.generate(ImagePrompt(ids, [frame(seed=s)]), SamplingParams(max_tokens=16)) for s in range(1, 9)]
    assert len({tuple(g.logprobs) for g in other}) > 1  # the answer depends on the image
    with pytest.raises(NoVisionTowerError):  # a tokenizer without image tokens: a text-only model
        await ScriptedEngine(tiny_tokenizer).generate(ImagePrompt([1, 2], [frame()]))
    with pytest.raises(TooManyImagesError):
        await ScriptedEngine(tok, max_model_len=len(ids) + 8, image_tokens=10).generate(ImagePrompt(ids, [frame()]))
    assert issubclass(TooManyImagesError, PromptTooLongError)


# -- HF: the engine's view == the trainer's view ------------------------------------------------------
async def test_hf_expanded_ids_and_logprobs_match_the_trainer(hf_vl, renderer):
    ids = chat_ids(hf_vl.tokenizer, 2)
    frames = [frame(), frame("arl/Sokoban-v0", 1)]
    gens = await hf_vl.generate(ImagePrompt(ids, frames), SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=2))
    rendered = renderer.render(ImagePrompt(ids, frames))
    for gen in gens:
        assert gen.prompt_token_ids == rendered.input_ids and gen.prompt_len == len(rendered.input_ids)
        assert np.allclose(trainer_logprobs(hf_vl.model, rendered, gen.token_ids), gen.logprobs, atol=1e-4)


async def test_hf_batches_text_and_image_requests_as_each_alone(hf_vl, renderer):
    """Left-padded rows of different lengths, one to two images, text rows beside them: each row's
    tokens and log-probs are those it gets alone and those of the trainer's forward."""
    tok = hf_vl.tokenizer
    text_ids = chat_ids(tok, 0, text="hi")
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    ends_with_image = [*chat_ids(tok, 0, text="Look:")[:-3], tok.convert_tokens_to_ids("<|vision_start|>"), pad]
    prompts = [text_ids, ImagePrompt(chat_ids(tok), [frame()]), text_ids + text_ids,
               ImagePrompt(chat_ids(tok, 2, text="Two:"), [frame("arl/Sokoban-v0", 5), frame(seed=7)]),
               ImagePrompt(ends_with_image, [frame("arl/Sokoban-v0")])]
    greedy = SamplingParams(max_tokens=5, temperature=0)
    alone = [await hf_vl.generate(p, greedy) for p in prompts]
    together = await asyncio.gather(*[hf_vl.generate(p, greedy) for p in prompts])
    for a, b, p in zip(alone, together, prompts, strict=True):
        assert a.token_ids == b.token_ids and np.allclose(a.logprobs, b.logprobs, atol=1e-4)
        if isinstance(p, ImagePrompt):
            rendered = renderer.render(p)
            assert np.allclose(trainer_logprobs(hf_vl.model, rendered, b.token_ids), b.logprobs, atol=1e-4)
        else:
            assert b.prompt_token_ids is None  # a token prompt ran as given


async def test_hf_bad_input_is_typed_and_the_engine_serves_on(hf_vl):
    ids = chat_ids(hf_vl.tokenizer, 4)
    with pytest.raises(TooManyImagesError, match="context of 512"):
        await hf_vl.generate(ImagePrompt(ids, [np.zeros((28 * 12, 28 * 12, 3), np.uint8)] * 4))  # 4 x 144 tokens
    with pytest.raises(UnreadableImageError):
        await hf_vl.generate(ImagePrompt(chat_ids(hf_vl.tokenizer), [b"\x89PNG broken"]))
    gen = await hf_vl.generate(ImagePrompt(chat_ids(hf_vl.tokenizer), [frame()]), SamplingParams(max_tokens=2))
    assert len(gen.token_ids) == 2


async def test_hf_text_model_refuses_images(hf_engine):
    with pytest.raises(NoVisionTowerError, match="no vision tower"):
        await hf_engine.generate(ImagePrompt([1, 2, 3], [frame()]))


def test_the_vllm_plugin_is_registered_and_enables_only_the_named_model(vl_path, monkeypatch):
    """vllm-async's engine core gets arl's vision change through the ``vllm.general_plugins`` entry
    point (setup.cfg): installed, it is found; where it is not, vllm-async says so in arl's words."""
    import importlib.metadata

    from arl.engine import vllm_vision
    from arl.engine.base import EngineUnsupportedError

    vllm_vision.check_plugin()  # make install registered it
    calls: list[str] = []
    monkeypatch.setattr(vllm_vision, "enable_vision", calls.append)
    monkeypatch.delenv(vllm_vision.ENV, raising=False)
    vllm_vision.vllm_plugin()  # any other use of vLLM in this environment: nothing happens
    with vllm_vision.vision_env(vl_path):
        vllm_vision.vllm_plugin()
    assert calls == [vl_path] and vllm_vision.ENV not in __import__("os").environ
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [])
    with pytest.raises(EngineUnsupportedError, match="make install"):
        vllm_vision.check_plugin()


# -- vLLM: the engine's view == the trainer's view ----------------------------------------------------
@pytest.fixture(scope="module")
def vllm_vl(vl_path):
    """tests/conftest.py's, at a 512-token context."""
    from arl.engine.vllm import VLLMEngine

    engine = VLLMEngine(vl_path, max_model_len=512, kv_cache_memory_bytes=64 * 2**20)
    yield engine
    asyncio.run(engine.close())


@pytest.mark.vllm
async def test_vllm_expanded_ids_and_logprobs_match_hf_and_the_trainer(vllm_vl, hf_vl, renderer):
    ids = chat_ids(vllm_vl.tokenizer, 2)
    frames = [frame("arl/Sokoban-v0", 2), frame()]
    greedy = SamplingParams(max_tokens=8, temperature=0)
    gen = await vllm_vl.generate(ImagePrompt(ids, frames), greedy)
    rendered = renderer.render(ImagePrompt(ids, frames))
    assert gen.prompt_token_ids == rendered.input_ids  # vLLM's RequestOutput.prompt_token_ids
    ref = await hf_vl.generate(ImagePrompt(ids, frames), greedy)
    assert gen.token_ids == ref.token_ids
    assert np.allclose(gen.logprobs, ref.logprobs, atol=1e-4)
    assert np.allclose(trainer_logprobs(hf_vl.model, rendered, gen.token_ids), gen.logprobs, atol=1e-4)


@pytest.mark.vllm
async def test_vllm_bad_input_is_typed_and_the_engine_serves_on(vllm_vl, vllm_engine):
    ids = chat_ids(vllm_vl.tokenizer, 4)
    with pytest.raises(TooManyImagesError):
        await vllm_vl.generate(ImagePrompt(ids, [np.zeros((28 * 12, 28 * 12, 3), np.uint8)] * 4))
    with pytest.raises(TooManyImagesError, match="at most 8"):  # vLLM's limit_mm_per_prompt, said in arl's words
        await vllm_vl.generate(ImagePrompt(chat_ids(vllm_vl.tokenizer, 9), [np.zeros((28, 28, 3), np.uint8)] * 9))
    with pytest.raises(UnreadableImageError):
        await vllm_vl.generate(ImagePrompt(chat_ids(vllm_vl.tokenizer), ["not a url"]))
    with pytest.raises(NoVisionTowerError):  # the text-only tiny model
        await vllm_engine.generate(ImagePrompt([1, 2, 3], [frame()]))
    gens = await asyncio.gather(*[vllm_vl.generate(ImagePrompt(chat_ids(vllm_vl.tokenizer), [f]), SamplingParams(max_tokens=2))
                                  for f in (frame(), frame("arl/Sokoban-v0"))])
    assert [g.prompt_len - len(chat_ids(vllm_vl.tokenizer)) + 1 for g in gens] == [16, 36]


@pytest.mark.vllm
async def test_vllm_serves_pushed_vlm_weights_as_the_trainer_has_them(vllm_vl, hf_vl):
    """A trainer's push reaches the vision tower too: after the same new weights go into both, vLLM
    and HF agree on an image prompt (and both differ from before)."""
    import torch

    ids = chat_ids(vllm_vl.tokenizer)
    prompt = ImagePrompt(ids, [frame("arl/Sokoban-v0", 4)])
    greedy = SamplingParams(max_tokens=6, temperature=0)
    before = await vllm_vl.generate(prompt, greedy)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf_vl.model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    await vllm_vl.update_weights(hf_vl.model.state_dict().items())
    after = await vllm_vl.generate(prompt, greedy)
    ref = await hf_vl.generate(prompt, greedy)
    assert after.logprobs != before.logprobs
    assert after.token_ids == ref.token_ids and np.allclose(after.logprobs, ref.logprobs, atol=1e-4)


@pytest.fixture(scope="module")
def vllm_async_vl(vl_path):
    from arl.engine.vllm_async import AsyncVLLMEngine

    engine = AsyncVLLMEngine(vl_path, max_model_len=512, kv_cache_memory_bytes=64 * 2**20)
    yield engine
    asyncio.run(engine.close())


@pytest.mark.vllm
async def test_vllm_async_serves_image_prompts_as_in_process_vllm(vllm_async_vl, vllm_vl, hf_vl, renderer):
    """vllm-async's engine core (a child process) loads tiny-vl through arl's vLLM plugin
    (arl.engine.vllm_vision.vllm_plugin) and runs the same expanded ids, tokens and log-probs as
    in-process vLLM and the trainer's forward, for two images and for a batch of one-image prompts."""
    # hf_vl holds what vllm_vl serves (a test above may have pushed moved weights into both): push them here too
    await vllm_async_vl.update_weights(hf_vl.model.state_dict().items())
    ids = chat_ids(vllm_vl.tokenizer, 2)
    frames = [frame("arl/Sokoban-v0", 2), frame()]
    greedy = SamplingParams(max_tokens=8, temperature=0)
    gen = await vllm_async_vl.generate(ImagePrompt(ids, frames), greedy)
    ref = await vllm_vl.generate(ImagePrompt(ids, frames), greedy)
    rendered = renderer.render(ImagePrompt(ids, frames))
    assert gen.prompt_token_ids == ref.prompt_token_ids == rendered.input_ids
    assert gen.token_ids == ref.token_ids and np.allclose(gen.logprobs, ref.logprobs, atol=1e-4)
    assert np.allclose(trainer_logprobs(hf_vl.model, rendered, list(gen.token_ids)), gen.logprobs, atol=1e-4)
    sampled = SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    prompts = [ImagePrompt(chat_ids(vllm_vl.tokenizer), [f]) for f in (frame(seed=1), frame("arl/Sokoban-v0", 5))]
    ours = await asyncio.gather(*[vllm_async_vl.generate(p, sampled) for p in prompts])
    theirs = await asyncio.gather(*[vllm_vl.generate(p, sampled) for p in prompts])
    for a, b in zip(ours, theirs, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids and a.token_ids == b.token_ids
        assert np.allclose(a.logprobs, b.logprobs, atol=1e-4)
    with pytest.raises(UnreadableImageError):
        await vllm_async_vl.generate(ImagePrompt(chat_ids(vllm_vl.tokenizer), [b"not an image"]))
    with pytest.raises(TooManyImagesError, match="at most 8"):
        await vllm_async_vl.generate(ImagePrompt(chat_ids(vllm_vl.tokenizer, 9), [np.zeros((28, 28, 3), np.uint8)] * 9))


async def test_scripted_image_tokens_from_the_config():
    from arl.engine import make_engine

    engine = make_engine(backend="scripted", model="tiny-vl", scripted={"image_tokens": 2})
    ids = chat_ids(engine.tokenizer)
    gen = await engine.generate(ImagePrompt(ids, [frame()]), SamplingParams(max_tokens=8))
    assert gen.prompt_len == len(ids) + 1 and engine.image_renderer.tokens_per_image == 2
