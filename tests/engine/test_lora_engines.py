"""Adapter-only weight sync: after `update_adapter` every backend's log-probs equal the trainer's.

One LoRA-enabled engine per backend for the module (vLLM must be told at start-up). The contract
(log-probs of the served policy within 1e-4 of the trainer's peft model) is checked through the
trainer's own push, with a real rollout step in between; the rest checks the adapter life cycle.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from arl.engine import SamplingParams, make_engine

pytestmark = pytest.mark.anyio

LORA_BACKENDS = [pytest.param("vllm", marks=pytest.mark.vllm), pytest.param("vllm-async", marks=pytest.mark.vllm),
                 "hf"]
PROMPT = list(range(5, 60))


@pytest.fixture(scope="module", params=LORA_BACKENDS)
def lora_engine(request, tiny_path):
    from arl.engine.vllm_lora import lora_engine_args

    backend = request.param
    extra = lora_engine_args(8) if backend.startswith("vllm") else {}
    engine = make_engine(backend=backend, model="tiny", max_model_len=1024, kv_cache_memory_bytes=64 * 2**20,
                         extra=extra)
    yield engine
    asyncio.run(engine.close())


def _peft_model(tiny_path, seed: int):
    """The tiny model under a rank-8 adapter whose B is random (so the adapter changes the outputs)."""
    from transformers import AutoModelForCausalLM

    from arl.config import LoRAConfig
    from arl.train import lora

    torch.manual_seed(seed)
    model = lora.wrap(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32), LoRAConfig(rank=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.3)
    return model.eval()


def _logprobs_of(model, prompt: list[int], completion: list[int]) -> list[float]:
    from arl.algo import token_logprobs

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        return token_logprobs(model(input_ids=ids).logits, ids)[0, len(prompt):].tolist()


async def _sample(engine, max_tokens: int = 16):
    return await engine.generate(PROMPT, SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=3))


async def _base_weights(engine, tiny_path) -> None:
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    await engine.update_weights(list(original.state_dict().items()))


async def test_trainer_adapter_push_makes_engine_logprobs_equal_trainer_logprobs(lora_engine, tiny_path, tmp_path):
    from arl.config import load_config
    from arl.train import Trainer

    config = load_config(None, [  # one small FrozenLake step
        f"out_dir={tmp_path}", "name=t", "steps=1", "tensorboard=false", "lora.rank=8",
        "rollout.env_id=arl/FrozenLake-v0", "rollout.mode=step", "rollout.num_groups=1", "rollout.group_size=4",
        "rollout.manager.max_tokens=8", "rollout.manager.history_len=0", "rollout.manager.max_turns=3", "eval.num_seeds=4", "eval.every=0",
        "eval.at_start=false", "optim.lr=0.01", "optim.micro_batch_size=8", "engine.max_model_len=1024",
    ])
    trainer = Trainer(config, engine=lora_engine)  # not owned: the module's engine stays open
    try:
        await trainer.setup()
        await trainer.step()
        lora_bytes = sum(p.numel() * 4 for n, p in trainer.model.named_parameters() if ".lora_" in n)
        assert trainer.push_bytes == lora_bytes
        gen = await _sample(lora_engine)
        assert gen.policy_version == lora_engine.policy_version
        assert _logprobs_of(trainer.model, PROMPT, gen.token_ids) == pytest.approx(gen.logprobs, abs=1e-4)
    finally:
        trainer.logger.close()
        await _base_weights(lora_engine, tiny_path)


async def test_new_adapter_per_version_old_one_removed_full_push_drops_it(lora_engine, tiny_path, tmp_path):
    first, second = _peft_model(tiny_path, 1), _peft_model(tiny_path, 2)
    from arl.train import lora

    await lora_engine.update_adapter(lora.adapter_of(first))
    # A long request in flight while the next adapter lands finishes on the adapter it started with.
    running = asyncio.ensure_future(_sample(lora_engine, max_tokens=64))
    await asyncio.sleep(0.05)
    await lora_engine.update_adapter(lora.adapter_of(second))
    version = lora_engine.policy_version
    old = await running
    gen = await _sample(lora_engine)
    assert gen.policy_version == version and old.policy_version in (version - 1, version)
    assert _logprobs_of(first if old.policy_version == version - 1 else second, PROMPT, old.token_ids) == \
        pytest.approx(old.logprobs, abs=1e-4)
    assert _logprobs_of(second, PROMPT, gen.token_ids) == pytest.approx(gen.logprobs, abs=1e-4)
    if lora_engine.name.startswith("vllm"):
        for _ in range(50):  # the driver unloads the replaced adapter once its request is done
            if len(await lora_engine.loaded_adapters()) == 1:
                break
            await asyncio.sleep(0.05)
        assert len(await lora_engine.loaded_adapters()) == 1

    # A peft adapter directory (what a LoRA checkpoint holds, written by peft) loads as it is.
    second.save_pretrained(tmp_path / "ckpt")
    await lora_engine.update_adapter(tmp_path / "ckpt")
    gen = await _sample(lora_engine)
    assert _logprobs_of(second, PROMPT, gen.token_ids) == pytest.approx(gen.logprobs, abs=1e-4)

    # Full weights replace the whole policy: the adapter is dropped.
    await _base_weights(lora_engine, tiny_path)
    gen = await _sample(lora_engine)
    with second.disable_adapter():
        assert _logprobs_of(second, PROMPT, gen.token_ids) == pytest.approx(gen.logprobs, abs=1e-4)
    if lora_engine.name.startswith("vllm"):
        for _ in range(50):
            if not await lora_engine.loaded_adapters():
                break
            await asyncio.sleep(0.05)
        assert not await lora_engine.loaded_adapters()


@pytest.mark.vllm
async def test_engine_without_lora_serves_the_merged_weights(vllm_engine, tiny_path):
    from arl.train import lora

    model = _peft_model(tiny_path, 3)
    version = vllm_engine.policy_version
    try:
        await vllm_engine.update_adapter(lora.adapter_of(model))
        gen = await _sample(vllm_engine)
        assert gen.policy_version == version + 1
        assert _logprobs_of(model, PROMPT, gen.token_ids) == pytest.approx(gen.logprobs, abs=1e-4)
    finally:
        await _base_weights(vllm_engine, tiny_path)


async def test_scripted_counts_and_the_fallback_loads_merged_weights(scripted_engine, tiny_path, tmp_path):
    from arl.engine.base import BaseEngine, EngineError, LoRAAdapter
    from arl.train import lora

    model = _peft_model(tiny_path, 4)
    adapter = lora.adapter_of(model)
    await scripted_engine.update_adapter(adapter)
    assert scripted_engine.adapter_updates == 1 and scripted_engine.policy_version == 1
    assert scripted_engine.adapter_bytes_received == adapter.nbytes == 45056 * 4

    class NoLoRAPath(BaseEngine):  # a backend that implements only the full-weight push
        loaded: dict = {}

        async def _generate_n(self, prompt, params):
            raise NotImplementedError

        async def _update_weights(self, named_tensors):
            self.loaded = dict(named_tensors)

    engine = NoLoRAPath(scripted_engine.tokenizer, 1024, 1024)
    await engine.update_adapter(adapter)
    merged = model.merge_and_unload().state_dict()
    assert engine.policy_version == 1 and engine.loaded.keys() == merged.keys()
    for name, t in merged.items():
        torch.testing.assert_close(engine.loaded[name], t, rtol=1e-6, atol=1e-6)
    adapter.save(tmp_path / "a")  # read back from disk, an adapter has no merged weights to fall back on
    assert LoRAAdapter.load(tmp_path / "a").tensors.keys() == adapter.tensors.keys()
    with pytest.raises(EngineError, match="no LoRA path"):
        await engine.update_adapter(tmp_path / "a")
