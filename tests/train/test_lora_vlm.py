"""LoRA on a VLM (issue 46): the zoo's tiny-vl trains a LoRA adapter on FrozenLake's frames.

The adapter goes on the language model only (the vision tower stays frozen and adapter-free unless
``lora.vision``), the trainer's log-probs are the engine's after the push, the base directory a
warm-start writes is a VLM an engine serves images from (its image processor beside it), and a
checkpoint's adapter loads on it. HF everywhere; vLLM's LoRA path under the `vllm` marker.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from trainer_support import metrics_rows, small_config

from arl.config import ConfigError, LoRAConfig
from arl.train import Trainer, lora

pytestmark = pytest.mark.anyio

VL_RUN = ("model=tiny-vl", "steps=1", "lora.rank=8", "rollout.manager.observation=image",
          "rollout.manager.prompt_style=compact", "rollout.manager.max_turns=2", "rollout.num_groups=1",
          "optim.micro_batch_size=4", "sft.steps=1", "sft.batch_episodes=4")


def _adapted(model) -> list[str]:
    return [n for n, m in model.named_modules() if hasattr(m, "lora_A") and len(getattr(m, "lora_A", {}))]


def test_the_adapter_goes_on_the_language_model_only(vl_path):
    from arl.models.tiny_vl import auto_model_class

    targets = ["q_proj", "v_proj", "qkv", "fc1", "gate_proj"]  # qkv, fc1: tiny-vl's vision tower's names
    model = auto_model_class(vl_path).from_pretrained(vl_path, dtype=torch.float32)
    assert lora.vision_towers(model) == ["model.visual"]
    language = _adapted(lora.wrap(model, LoRAConfig(rank=4, target_modules=targets)))
    assert language and not [n for n in language if ".visual." in n]
    assert {n.rsplit(".", 1)[1] for n in language} == {"q_proj", "v_proj", "gate_proj"}
    model = auto_model_class(vl_path).from_pretrained(vl_path, dtype=torch.float32)
    both = _adapted(lora.wrap(model, LoRAConfig(rank=4, target_modules=targets, vision=True)))
    assert {n.rsplit(".", 1)[1] for n in both if ".visual." in n} == {"qkv", "fc1"}


def test_lora_vision_keeps_vllm_on_merged_weights(tmp_path):
    c = small_config(tmp_path, "model=tiny-vl", "lora.rank=8", "lora.vision=true", "engine.backend=vllm")
    assert "enable_lora" not in lora.engine_config(c).extra  # vLLM would drop the vision tower's adapters
    assert lora.engine_config(small_config(tmp_path, "model=tiny-vl", "lora.rank=8",
                                           "engine.backend=vllm")).extra["enable_lora"]
    c = small_config(tmp_path, "model=tiny-vl", "lora.rank=8", "lora.vision=true", "engine.backend=vllm",
                     "engine.extra.enable_lora=true")
    with pytest.raises(ConfigError, match="ignores adapters on the vision tower"):
        lora.engine_config(c)


async def _one_step(tmp_path, backend: str):
    c = small_config(tmp_path, f"engine.backend={backend}", *VL_RUN)
    async with Trainer(c) as trainer:
        await trainer.train()
        assert not [n for n in _adapted(trainer.model) if ".visual." in n]
        vision = {n: p for n, p in trainer.model.named_parameters() if ".visual." in n}
        assert vision and not any(p.requires_grad for p in vision.values())
    [row] = [r for r in metrics_rows(trainer.run_dir) if "train/loss" in r]
    assert row["rollout/num_samples"] > 0 and row["rollout/prompt_tokens_mean"] > 16  # 16 image tokens a frame
    assert row["train/logprob_gap"] < 1e-4 and row["train/skipped_updates"] == 0
    assert np.isfinite(row["train/loss"]) and row["train/grad_norm"] > 0
    return trainer.run_dir


async def _serves_the_checkpoint(run_dir) -> None:
    """run_dir/base is a VLM an engine serves images from; the checkpoint's adapter loads on it."""
    from peft import PeftModel

    from arl.engine import SamplingParams
    from arl.engine.hf import HFEngine
    from arl.engine.images import ImagePrompt
    from arl.models.tiny_vl import auto_model_class

    base = run_dir / lora.BASE_DIR
    assert (base / "preprocessor_config.json").is_file()
    model = PeftModel.from_pretrained(auto_model_class(base).from_pretrained(base), run_dir / "ckpt_000001")
    assert _adapted(model) and not [n for n in _adapted(model) if ".visual." in n]
    engine = HFEngine(str(base), max_model_len=512)
    try:
        ids = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "go"}]}],
            tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        gen = await engine.generate(ImagePrompt(ids, [np.zeros((112, 112, 3), np.uint8)]), SamplingParams(max_tokens=3))
        assert gen.prompt_len == len(ids) - 1 + 16
    finally:
        await engine.close()


async def test_one_lora_step_on_frames_with_the_hf_engine(tmp_path):
    """The HF engine injects the pushed adapter with peft (the same exclusion of the vision tower)."""
    run_dir = await _one_step(tmp_path, "hf")
    await _serves_the_checkpoint(run_dir)
    # resume: the base's weights come back from run_dir/base, a VLM directory
    c = small_config(tmp_path, "engine.backend=hf", *VL_RUN[:1], "steps=2", *VL_RUN[2:])
    async with Trainer(c, resume=True) as trainer:
        await trainer.setup()
        assert trainer.step_count == 1


@pytest.mark.vllm
@pytest.mark.parametrize("backend", ["vllm", "vllm-async"])
async def test_one_lora_step_on_frames_with_the_vllm_lora_path(tmp_path, backend):
    """vLLM serves the adapter itself (LoRARequest on the warm-started base): the weight-sync canary
    after the push compares its log-probs with the trainer's on the text and the image probe."""
    run_dir = await _one_step(tmp_path, backend)
    rows = metrics_rows(run_dir)
    assert any("sync/canary_image_max_abs" in r for r in rows)
    await _serves_the_checkpoint(run_dir)
