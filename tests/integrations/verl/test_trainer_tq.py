"""ArlAgentLoop's outputs down verl's v1 training path as far as a CPU goes: verl's own
`AgentLoopWorkerTQ._agent_loop_postprocess` into a real TransferQueue (local Ray), then the
``arl_sync`` trainer's advantage step (with verl's rollout correction on) and verl's
`_compute_metrics`, the step that failed on None weight versions after the first update.

Stops before verl's workers: ``compute_log_prob`` / ``update_actor`` need the FSDP worker group,
which the old log-probs written here stand in for (see docs/verl.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arl.engine.scripted import ScriptedEngine

pytestmark = pytest.mark.anyio

ROLLOUT = {"mode": "traj", "manager": {"max_tokens": 24, "max_turns": 5}}
GROUPS = {"g0": 3, "g1": 4}  # uid -> env seed
SESSIONS = 3


@pytest.fixture(scope="module")
def transfer_queue():
    """verl's TransferQueue on a local Ray (the controller and one storage unit are Ray actors)."""
    ray = pytest.importorskip("ray")
    tq = pytest.importorskip("transfer_queue")
    from omegaconf import OmegaConf

    # logical CPUs for the actors' num_cpus=1 each; they idle between calls
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="arl_verl_tests")
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield tq
        tq.close()
    finally:
        ray.shutdown()


@pytest.fixture
def tq_worker(verl_worker):
    """verl's AgentLoopWorkerTQ post-processing (the class under its Ray actor wrapper) on the
    fixture worker's state."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class
    verl_worker.tq_postprocess = cls._agent_loop_postprocess.__get__(verl_worker)
    return verl_worker


async def _play(make_loop, tq_worker, tiny_tokenizer, partition: str, global_steps: int, failing_after):
    """Two groups x three sessions into TransferQueue; session 2 of g1 dies on its second call,
    session 1 of g1 before its first. Returns {key: AgentLoopOutput}."""
    engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=11)
    outputs = {}
    for uid, seed in GROUPS.items():
        for session in range(SESSIONS):
            e = failing_after(engine, {("g1", 1): 0, ("g1", 2): 1}.get((uid, session), 10**6))
            loop, _ = make_loop(e, ROLLOUT)
            row = {"extra_info": {"env_id": "arl/FrozenLake-v0", "seed": seed, "tag": "train", "index": 0},
                   "uid": f"{partition}{uid}", "session_id": session, "global_steps": global_steps,
                   "raw_prompt": [{"role": "user", "content": "play"}]}
            out = await loop.run({"temperature": 1.0, "logprobs": True}, **row)
            outputs[f"{partition}{uid}_{session}_0"] = out
            await tq_worker.tq_postprocess(out, validate=False, **row)
    return outputs


def _batch(tq, partition_keys):
    from transfer_queue.metadata import KVBatchMeta

    tags = tq.kv_list("train")["train"]
    keys = sorted(k for k in tags if k in partition_keys)
    return KVBatchMeta(keys=keys, tags=[tags[k] for k in keys], partition_id="train")


def _trainer(example_config, *overrides):
    from verl.trainer.ppo.v1 import get_trainer_cls

    from arl.integrations.verl import setup_verl

    setup_verl()
    config = example_config(1, "actor_rollout_ref.rollout.n=3", *overrides)
    return get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


def _put_old_log_probs(tq, batch):
    """What `_compute_old_log_prob` leaves in TransferQueue, from a policy 0.05 nats off the rollout."""
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["rollout_log_probs", "response_mask"])
    mask = data["response_mask"]
    padded = data.to_padded_tensor()
    old = padded["rollout_log_probs"] + 0.05 * padded["response_mask"]
    tq.kv_batch_put(keys=batch.keys, partition_id="train",
                    fields=TensorDict({"old_log_probs": response_to_nested(old, mask)}, batch_size=len(batch)))


async def test_outputs_carry_weight_versions_into_transfer_queue(make_loop, tq_worker, tiny_tokenizer, transfer_queue,
                                                                 failing_after):
    outputs = await _play(make_loop, tq_worker, tiny_tokenizer, "v", global_steps=1, failing_after=failing_after)
    batch = _batch(transfer_queue, outputs)
    for key, tag in zip(batch.keys, batch.tags, strict=True):
        # the fake server answers with global_steps 0; a row without a call reports the row's version
        assert (tag["min_global_steps"], tag["max_global_steps"]) == (0, 0), key
        assert outputs[key].extra_fields["min_global_steps"] == 0
    assert outputs["vg1_1_0"].extra_fields["arl_exit_reason"] == "engine_error"
    assert outputs["vg1_1_0"].response_mask == [0] and len(outputs["vg1_1_0"].response_ids) == 1


async def test_advantage_and_metrics_steps_run_on_loop_outputs(make_loop, tq_worker, tiny_tokenizer,
                                                               transfer_queue, example_config, failing_after):
    """arl_gigpo through the arl_sync trainer: the advantages are `token_advantages` with the
    verl-agent defaults, abnormal rows get none, verl's rollout correction runs (token IS weights),
    and verl's `_compute_metrics` accepts the batch."""
    from arl.integrations.verl.gigpo import GIGPO_DEFAULTS, token_advantages

    outputs = await _play(make_loop, tq_worker, tiny_tokenizer, "a", global_steps=1, failing_after=failing_after)
    batch = _batch(transfer_queue, outputs)
    _put_old_log_probs(transfer_queue, batch)
    trainer = _trainer(example_config, "algorithm.rollout_correction.rollout_is=token")
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)

    data = transfer_queue.kv_batch_get(keys=batch.keys, partition_id="train",
                                       select_fields=["advantages", "returns", "response_mask", "rollout_is_weights"])
    padded = data.to_padded_tensor()
    adv, padded_mask = padded["advantages"], padded["response_mask"]
    fields = [outputs[k].extra_fields for k in batch.keys]
    want, _ = token_advantages(padded_mask, fields, [k.split("_")[0] for k in batch.keys],
                               [k.rsplit("_", 1)[0] for k in batch.keys], **GIGPO_DEFAULTS)
    torch.testing.assert_close(adv, want)
    assert adv.abs().sum() > 0
    for i, key in enumerate(batch.keys):  # the engine-error rows: no loss, no advantage
        if outputs[key].extra_fields["arl_exit_reason"] not in ("terminated", "truncated"):
            assert outputs[key].extra_fields["arl_masked"] and adv[i].abs().sum() == 0 and padded_mask[i].sum() == 0
    assert sum(outputs[k].extra_fields["arl_masked"] for k in batch.keys) == 2
    assert any(k.startswith("arl_gigpo/") for k in metrics)
    assert any(k.startswith("rollout_corr/") for k in metrics), sorted(metrics)
    weights = padded["rollout_is_weights"]
    assert torch.all(weights[padded_mask.bool()] > 0)

    metrics = {}
    # the one piece of verl's `init()` (Ray resource pools, GPU workers) that metrics read: the GPU count
    trainer._get_n_gpus_for_throughput = lambda: 1
    trainer._compute_metrics(batch, metrics, timing_raw={"step": 1.0, "gen": 0.5}, global_steps=1, epoch=0)
    assert metrics["training/off_policy/trajectory_staleness/mean"] == 0
    assert metrics["training/off_policy/trajectory_spans/max"] == 1
    assert np.isfinite(metrics["critic/advantages/mean"])


async def test_arl_grpo_rows_masked_too(make_loop, tq_worker, tiny_tokenizer, transfer_queue, example_config,
                                       failing_after):
    """The masking lives in the rows, so verl's own estimators leave abnormal episodes out as well."""
    outputs = await _play(make_loop, tq_worker, tiny_tokenizer, "r", global_steps=1, failing_after=failing_after)
    batch = _batch(transfer_queue, outputs)
    _put_old_log_probs(transfer_queue, batch)
    trainer = _trainer(example_config, "algorithm.adv_estimator=grpo")
    trainer._compute_advantage(batch, {})
    data = transfer_queue.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages", "response_mask"])
    adv = data.to_padded_tensor()["advantages"]
    for i, key in enumerate(batch.keys):
        if outputs[key].extra_fields["arl_masked"]:
            assert adv[i].abs().sum() == 0


STEP = {"mode": "step", "manager": {"max_tokens": 8, "max_turns": 6, "history_len": 0, "prompt_style": "compact"}}


async def test_step_rows_and_verls_batch_padding(make_loop, tq_worker, tiny_tokenizer, transfer_queue, example_config):
    """Step mode's rows (one per turn, keys ``{uid}_{session}_{t}``) through verl's v1 worker, padded
    by verl to a multiple of its mini-batch: the padding rows (copies of the first row's
    extra_fields) get no advantage and count in no GiGPO group; the real rows get `token_advantages`
    of the real rows alone, one trajectory per session."""
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    from arl.integrations.verl.gigpo import GIGPO_DEFAULTS, token_advantages

    engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=12)
    outputs = {}
    for uid, seed in GROUPS.items():
        for session in range(SESSIONS):
            loop, _ = make_loop(engine, STEP)
            row = {"extra_info": {"env_id": "arl/FrozenLake-v0", "seed": seed, "tag": "train", "index": 0},
                   "uid": f"s{uid}", "session_id": session, "global_steps": 1,
                   "raw_prompt": [{"role": "user", "content": "play"}]}
            outs = await loop.run({"temperature": 1.0, "logprobs": True}, **row)
            outputs.update({f"s{uid}_{session}_{t}": out for t, out in enumerate(outs)})
            await tq_worker.tq_postprocess(outs, validate=False, **row)
    real = _batch(transfer_queue, outputs)
    assert len(real) == len(outputs) > len(GROUPS) * SESSIONS  # multi-turn episodes, a row per turn
    batch = upsample_batch_to_divisible_size(real, len(real) + 5, tiny_tokenizer.eos_token_id)
    assert len(batch) == len(real) + 5 and sum(bool(t.get("is_padding")) for t in batch.tags) == 5
    _put_old_log_probs(transfer_queue, batch)
    metrics: dict = {}
    _trainer(example_config)._compute_advantage(batch, metrics)

    data = transfer_queue.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages", "response_mask"])
    adv = data.to_padded_tensor()["advantages"]
    n = len(real)  # verl appends the padding rows
    mask = transfer_queue.kv_batch_get(keys=real.keys, partition_id="train",
                                       select_fields=["response_mask"]).to_padded_tensor()["response_mask"]
    want, stats = token_advantages(mask, [outputs[k].extra_fields for k in real.keys],
                                   [k.split("_")[0] for k in real.keys], [k.rsplit("_", 1)[0] for k in real.keys],
                                   **GIGPO_DEFAULTS)
    torch.testing.assert_close(adv[:n, : want.shape[1]], want)
    assert adv.abs().sum() > 0 and adv[n:].abs().sum() == 0
    assert metrics["arl_gigpo/" + next(iter(stats))] == pytest.approx(stats[next(iter(stats))])
    assert {k: metrics[f"arl_gigpo/{k}"] for k in stats} == pytest.approx(stats)
    # the step's episodes, each once (verl's critic/score/mean counts rows)
    firsts = [outputs[k] for k in real.keys if k.endswith("_0")]
    assert metrics["arl/episodes"] == len(GROUPS) * SESSIONS == len(firsts)
    assert metrics["arl/episode_score"] == pytest.approx(np.mean([o.reward_score for o in firsts]))
    assert metrics["arl/success_rate"] == np.mean([o.extra_fields["arl_success"] for o in firsts])
