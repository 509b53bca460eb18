"""LoRA in the trainer: only the adapter trains and travels, the KL reference is the base with the
adapter off, resume is exact, a checkpoint loads in peft (scripted engine; the engines: tests/engine)."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_support import (
    metrics_rows,
    params_of,
    scripted,
    small_config,
    step_gradients,
    uninterrupted_then_killed,
)

from arl.train import Trainer, lora

pytestmark = pytest.mark.anyio


def _logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    from arl.algo import token_logprobs

    with torch.no_grad():
        return token_logprobs(model(input_ids=ids).logits, ids)


async def test_only_the_adapter_trains_and_only_it_is_pushed(tmp_path):
    config = small_config(tmp_path, "lora.rank=8", "steps=1", "algo.kl_coef=0.1")
    engine = scripted(config)
    async with Trainer(config, engine=engine) as trainer:
        await trainer.setup()
        assert (engine.weight_updates, engine.adapter_updates) == (1, 1)  # an injected engine gets the base once
        before = params_of(trainer.model)
        ids = torch.tensor([list(range(5, 40))])
        base_lp = _logprobs(trainer.model, ids)  # B = 0: the wrapped model is the base model
        metrics = await trainer.step()
        after = params_of(trainer.model)
        moved = {n for n in before if not torch.equal(before[n], after[n])}
        assert moved and all(".lora_" in n for n in moved)
        assert {n for n in before if ".lora_B." in n} <= moved
        # The KL reference is the base: the adapter switched off, no copy.
        torch.testing.assert_close(_logprobs(trainer.ref_model, ids), base_lp, rtol=0, atol=0)
        assert not torch.allclose(_logprobs(trainer.model, ids), base_lp)
    assert (engine.weight_updates, engine.adapter_updates) == (1, 2)
    adapter_bytes = sum(p.numel() * 4 for n, p in after.items() if ".lora_" in n)
    assert metrics["train/weight_push_bytes"] == engine.adapter_bytes_received / 2 == adapter_bytes
    assert adapter_bytes < 0.1 * sum(p.numel() * 4 for p in after.values())
    assert "train/kl" in metrics or any(k.startswith("train/kl") for k in metrics)


def test_merged_weights_equal_peft_merge(tiny_path):
    import copy

    from transformers import AutoModelForCausalLM

    from arl.config import LoRAConfig

    model = lora.wrap(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32), LoRAConfig(rank=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1)
    merged = dict(lora.merged_weights(model))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == want.keys()
    for name, t in want.items():
        torch.testing.assert_close(merged[name], t, rtol=1e-6, atol=1e-6)
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict()
    assert {n for n in base if not torch.equal(base[n], merged[n])} == {
        n for n in base if n.endswith(".weight") and any(f".{m}." in n for m in LoRAConfig().target_modules)}


async def test_lora_resume_matches_an_uninterrupted_run_and_loads_in_peft(tmp_path):
    """Warm-started base, KL to it, LoRA on top: a run killed after step 1 and resumed ends bitwise
    where the uninterrupted run ends; its checkpoint is a peft adapter on run_dir/base."""
    extra = ("lora.rank=8", "steps=3", "save_every=1", "sft.steps=1", "sft.batch_episodes=4", "algo.kl_coef=0.5")
    want, part = await uninterrupted_then_killed(tmp_path, *extra)
    engine = scripted(part)
    async with Trainer(part, engine=engine) as trainer:
        await trainer.train(resume=True)
        assert trainer.step_count == 3
        got = params_of(trainer.model)
        ids = torch.tensor([list(range(5, 40))])
        trained_lp = _logprobs(trainer.model, ids)
    assert engine.weight_updates == 1  # the warm-started base, once; then adapters only
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)

    assert metrics_rows(tmp_path / "part" / "t") == metrics_rows(tmp_path / "full" / "t")

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ckpt = tmp_path / "part" / "t" / "ckpt_000003"
    base_dir = json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base_dir == str((tmp_path / "part" / "t" / "base").resolve())
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), ckpt)
    torch.testing.assert_close(_logprobs(loaded.eval(), ids), trained_lp, rtol=0, atol=1e-6)


async def test_gradient_checkpointing_gives_the_same_gradients(tmp_path):
    """optim.gradient_checkpointing recomputes activations in the backward pass: the same gradients
    (it saves memory on a GPU; on CPU it only costs time), also when the base is frozen (LoRA)."""
    grads = []
    for ckpt in (False, True):
        config = small_config(tmp_path / str(ckpt), f"optim.gradient_checkpointing={ckpt}", "steps=1",
                              "optim.grad_clip=null", "lora.rank=8")
        async with Trainer(config, engine=scripted(config)) as trainer:
            await trainer.setup()
            assert trainer.model.is_gradient_checkpointing is ckpt
            grads.append(await step_gradients(trainer))
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7)
