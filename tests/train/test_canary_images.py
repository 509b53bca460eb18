"""The weight-sync canary on a VLM (arl/train/canary.py; issue 46 item 3): the image probe.

A push that loads the decoder and skips the vision tower leaves every text prompt's log-probs
right, so only an image prompt can see it. These tests push new weights into an engine that drops
the vision tower's tensors: the text probe passes and the image probe stops the run. On the zoo's
tiny-vl (random init: agreement, not quality); HF everywhere, vLLM under the `vllm` marker.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from arl.engine.hf import HFEngine
from arl.train.canary import FP32, SyncCanary, WeightSyncError

pytestmark = pytest.mark.anyio


def _vision(name: str) -> bool:
    return ".visual." in f".{name}"


def _moved(model, seed: int):
    """The trainer's model after an 'update': every weight, decoder and vision tower, moved."""
    trainer = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return trainer


async def _push(engine, trainer, *, skip_vision: bool) -> None:
    """Push the trainer's weights; ``skip_vision``: a loader that drops the vision tower's tensors."""
    tensors = [(n, t) for n, t in trainer.state_dict().items() if not (skip_vision and _vision(n))]
    assert len(tensors) < len(trainer.state_dict()) or not skip_vision
    await engine.update_weights(tensors)


async def test_hf_vlm_canary_probes_an_image_and_catches_a_vision_tower_left_behind(vl_path):
    engine = HFEngine(vl_path, max_model_len=512)
    try:
        trainer = _moved(engine.model, seed=1)
        assert any(_vision(n) for n, _ in trainer.named_parameters())
        canary = SyncCanary(engine, trainer, engine.tokenizer)
        assert canary.image_prompt is not None and canary.rendered is not None
        assert (canary.rendered.image_token_mask.sum()) == 8  # probe_image: 56 x 112 px, 8 merged patches
        await _push(engine, trainer, skip_vision=False)
        metrics = await canary.check("full weights", "step 1")
        assert metrics["sync/canary_image_max_abs"] < 1e-4 and metrics["sync/canary_image_mean_abs"] < 1e-4
        assert metrics["sync/canary_max_abs"] < 1e-4
        # The next update moves everything again; this push leaves the vision tower behind.
        trainer2 = _moved(trainer, seed=2)
        canary2 = SyncCanary(engine, trainer2, engine.tokenizer)
        await _push(engine, trainer2, skip_vision=True)
        with pytest.raises(WeightSyncError) as err:
            await canary2.check("full weights", "step 2")
        # The text probe alone passes: only the image probe can see the vision tower.
        text = await canary2._probe(canary2.prompt, "full weights", "step 2", "")
        assert text is not None and text[0] <= FP32.max_abs
    finally:
        await engine.close()
    message = str(err.value)
    assert "at step 2" in message and "the image probe" in message and "with one image" in message
    assert "the vision tower's weights not loaded" in message


async def test_a_text_model_has_no_image_probe(tiny_path):
    engine = HFEngine(tiny_path, max_model_len=512)
    try:
        canary = SyncCanary(engine, engine.model, engine.tokenizer)
        metrics = await canary.check()
    finally:
        await engine.close()
    assert canary.image_prompt is None and set(metrics) == {"sync/canary_max_abs", "sync/canary_mean_abs"}


@pytest.mark.vllm
@pytest.mark.parametrize("backend", ["vllm", "vllm-async"])
async def test_vllm_vlm_canary_probes_an_image_and_catches_a_vision_tower_left_behind(vl_path, backend):
    from arl.engine.vllm import VLLMEngine
    from arl.engine.vllm_async import AsyncVLLMEngine

    hf = HFEngine(vl_path, max_model_len=512)
    cls = VLLMEngine if backend == "vllm" else AsyncVLLMEngine  # vllm-async: the image probe in its engine core
    engine = cls(vl_path, max_model_len=512, kv_cache_memory_bytes=64 * 2**20)
    try:
        trainer = _moved(hf.model, seed=1)
        canary = SyncCanary(engine, trainer, engine.tokenizer)
        assert canary.image_prompt is not None
        await _push(engine, trainer, skip_vision=False)
        metrics = await canary.check("full weights", "step 1")
        assert metrics["sync/canary_image_max_abs"] <= FP32.max_abs
        assert metrics["sync/canary_image_mean_abs"] <= FP32.mean_abs
        trainer2 = _moved(trainer, seed=2)
        await _push(engine, trainer2, skip_vision=True)
        with pytest.raises(WeightSyncError, match="the image probe"):
            await SyncCanary(engine, trainer2, engine.tokenizer).check("full weights", "step 2")
    finally:
        await engine.close()
        await hf.close()
    assert np.isfinite(metrics["sync/canary_image_max_abs"])


async def test_a_vlm_engine_without_an_image_path_fails_the_check_and_says_so(vl_path):
    """Every backend serving a VLM takes image prompts (vllm-async too): an engine with a renderer
    but no image path is broken, and the canary says so instead of leaving the vision tower unwatched."""
    from arl.engine.base import BaseEngine, EngineUnsupportedError

    class TextOnlyBackend(HFEngine):
        _generate_images_n = BaseEngine._generate_images_n  # the refusal of an engine without images

    engine = TextOnlyBackend(vl_path, max_model_len=512)
    try:
        canary = SyncCanary(engine, engine.model, engine.tokenizer)
        with pytest.raises(EngineUnsupportedError, match="does not take image prompts"):
            await canary.check()
    finally:
        await engine.close()


class _ReplyWithPlaceholder:
    """An engine whose image-probe reply holds the image placeholder at ``at`` (a young VLM's greedy
    reply can: the token is in its vocabulary); everything else is the wrapped engine's."""

    def __init__(self, engine, at: int) -> None:
        self._engine, self.at = engine, at

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def generate(self, prompt, params):
        import attrs

        from arl.engine.image_prompt import ImagePrompt

        gen = await self._engine.generate(prompt, params)
        if not isinstance(prompt, ImagePrompt):
            return gen
        ids = list(gen.token_ids)
        ids[self.at] = self._engine.image_renderer.image_token_id
        return attrs.evolve(gen, token_ids=ids)


@pytest.mark.parametrize("at", [0, 2])
async def test_an_image_placeholder_in_the_probe_reply_is_not_scored_as_an_image_slot(vl_path, at):
    engine = HFEngine(vl_path, max_model_len=512)
    try:
        trainer = copy.deepcopy(engine.model)
        canary = SyncCanary(_ReplyWithPlaceholder(engine, at), trainer, engine.tokenizer)
        assert canary.image_prompt is not None
        metrics = await canary.check("same weights", "step 1")  # used to die: image features and tokens do not match
        assert metrics["sync/canary_max_abs"] < 1e-3
        if at == 0:  # nothing before the placeholder to compare: the image metrics are absent, not 0
            assert "sync/canary_image_max_abs" not in metrics
        else:
            assert metrics["sync/canary_image_max_abs"] < 1e-3
        assert not canary.skip  # the canary stays on
    finally:
        await engine.close()
