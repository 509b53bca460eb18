"""``rollout.name=arl_hf`` without Ray: the server answers verl's token contract with the synced weight
version, and the adapter's weight-sync canary passes a real push and stops a dropped one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.anyio


class Remote:
    """A Ray actor handle's ``method.remote(...)`` over a local object (its async methods)."""

    def __init__(self, obj):
        self.obj = obj

    def __getattr__(self, name):
        return SimpleNamespace(remote=getattr(self.obj, name))


@pytest.fixture
def server(tiny_path):
    from verl.workers.config import HFModelConfig

    from arl.integrations.verl.cpu.rollout import ArlHFServer

    config = SimpleNamespace(max_model_len=None, prompt_length=256, response_length=64, seed=0, max_num_seqs=8)
    srv = ArlHFServer(config, HFModelConfig(path=tiny_path), replica_rank=0)
    yield srv
    import asyncio

    asyncio.run(srv.engine.close())


def moved_weights(tiny_path, scale=0.05):
    """The tiny model's weights after a (fake) update: what verl's FSDP engine would export."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    return [(name, p.detach() + scale * torch.randn(p.shape, generator=gen)) for name, p in model.named_parameters()]


def adapter_for(server, tiny_path):
    from verl.workers.config import HFModelConfig

    from arl.integrations.verl.cpu.rollout import ArlHFServerAdapter

    adapter = object.__new__(ArlHFServerAdapter)  # verl's BaseRollout init needs a full RolloutConfig
    adapter.replica_rank, adapter.rollout_rank = 0, 0
    adapter.server, adapter.canary, adapter.reference = Remote(server), None, None
    adapter.model_config = HFModelConfig(path=tiny_path)
    return adapter


async def test_server_answers_verls_token_contract_with_the_synced_version(server, tiny_path):
    prompt = server.engine.tokenizer.encode("hello there")
    params = {"max_tokens": 5, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "seed": 3,
              "repetition_penalty": 1.0}
    out = await server.generate("req", prompt_ids=prompt, sampling_params=params)
    assert len(out.token_ids) == len(out.log_probs) == 5 and out.stop_reason in ("completed", "length")
    assert out.extra_fields["global_steps"] == 0 and await server.sync_metrics() == {}
    await server.update_weights(moved_weights(tiny_path), global_steps=3)
    out = await server.generate("req", prompt_ids=prompt, sampling_params=params)
    assert out.extra_fields["global_steps"] == 3 and out.extra_fields["arl_engine_version"] == 1
    assert (await server.sync_metrics())["arl_sync/weight_version"] == 3


async def test_canary_passes_a_push_and_stops_a_dropped_one(server, tiny_path):
    from arl.train.canary import WeightSyncError

    adapter = adapter_for(server, tiny_path)
    await adapter.update_weights(iter(moved_weights(tiny_path, 0.05)), global_steps=1)
    metrics = await server.sync_metrics()
    assert metrics["arl_sync/canary_max_abs"] < 1e-4 and metrics["arl_sync/weight_version"] == 1

    async def dropped(named_tensors, global_steps):  # a server that acknowledges and keeps the old weights
        server.global_steps = global_steps
        return server.engine.policy_version

    server.update_weights = dropped
    with pytest.raises(WeightSyncError, match="global step 2"):
        await adapter.update_weights(iter(moved_weights(tiny_path, 0.2)), global_steps=2)


async def test_adapter_refuses_lora_and_delta_syncs(server, tiny_path):
    adapter = adapter_for(server, tiny_path)
    with pytest.raises(NotImplementedError, match="LoRA"):
        await adapter.update_weights(iter([]), peft_config={"r": 8})
    with pytest.raises(NotImplementedError, match="delta_flush"):
        await adapter.update_weights(iter([]), wire_format="delta_flush")


def test_replica_sync_metrics_combine_worst_gap_and_oldest_version():
    from arl.integrations.verl.trainer import replica_sync_metrics

    replicas = [SimpleNamespace(sync_metrics=lambda: {"arl_sync/canary_max_abs": 1e-6, "arl_sync/weight_version": 3.0}),
                SimpleNamespace(sync_metrics=lambda: {"arl_sync/canary_max_abs": 2e-6, "arl_sync/weight_version": 2.0}),
                SimpleNamespace()]  # verl's own replicas keep no such figures
    assert replica_sync_metrics(replicas) == {"arl_sync/canary_max_abs": 2e-6, "arl_sync/weight_version": 2.0}
