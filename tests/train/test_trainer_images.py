"""`arl.train.Trainer` on image observations (issue 46 items 4 and 5): the zoo's tiny-vl on the HF
engine, step mode showing FrozenLake's frames. One step runs; the trainer's log-probs of the image
samples are the engine's; the checkpoint is a VLM the HF engine serves images from again."""

from __future__ import annotations

import numpy as np
import pytest
from trainer_support import metrics_rows, small_config

from arl.train import Trainer

pytestmark = pytest.mark.anyio


async def test_one_step_on_frames_with_the_hf_engine(tmp_path):
    from arl.engine import SamplingParams
    from arl.engine.hf import HFEngine
    from arl.engine.images import ImagePrompt

    c = small_config(tmp_path, "model=tiny-vl", "steps=1", "engine.backend=hf", "rollout.manager.observation=image",
                     "rollout.manager.prompt_style=compact", "rollout.manager.max_turns=2", "rollout.num_groups=1",
                     "optim.micro_batch_size=4")
    async with Trainer(c) as trainer:
        await trainer.train()
        ckpt = trainer.run_dir / "ckpt_000001"
        # the engine never samples vision tokens: the trainer scores the same masked distribution
        import torch

        from arl.models.tiny_vl import MASKED_LOGIT
        forbidden = list(trainer.engine.forbidden_token_ids)
        with torch.no_grad():
            logits = trainer.model(input_ids=torch.tensor([[1, 2, 3]], device=trainer.device)).logits
        assert len(forbidden) == 4 and (logits[..., forbidden] == MASKED_LOGIT).all()
    [row] = metrics_rows(trainer.run_dir)
    assert row["rollout/num_samples"] > 0 and row["rollout/abnormal_rate"] == 0.0
    assert row["rollout/prompt_tokens_mean"] > 16  # a 4x4 frame is 16 image tokens
    assert row["train/logprob_gap"] < 1e-4 and row["train/skipped_updates"] == 0
    assert np.isfinite(row["train/loss"]) and row["train/grad_norm"] > 0
    # the checkpoint serves image prompts (its image processor was saved beside the weights)
    engine = HFEngine(str(ckpt), max_model_len=512)
    try:
        ids = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "go"}]}],
            tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        frame = np.zeros((112, 112, 3), np.uint8)
        gen = await engine.generate(ImagePrompt(ids, [frame]), SamplingParams(max_tokens=3))
        assert gen.prompt_len == len(ids) - 1 + 16
    finally:
        await engine.close()
