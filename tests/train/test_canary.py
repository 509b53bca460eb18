"""The weight-sync canary (arl/train/canary.py) and the engine/trainer mismatch tail (update.py).

A correct hf engine passes the canary after a real update and push; an engine that silently drops
the push, or a LoRA adapter that never loads, stops the run with WeightSyncError at the first step
after the weights change (hf backend on the tiny model: the cheapest real one; the vLLM backends
run the same canary in test_trainer.py's push test, which now checks at set-up and after its step).
"""

from __future__ import annotations

import doctest
import logging

import numpy as np
import pytest
import torch
from trainer_support import scripted, small_config

from arl.engine import Generation
from arl.engine.hf import HFEngine
from arl.train import Trainer, WeightSyncError, canary, update
from arl.train.canary import BF16, FP32, SyncCanary, tolerance_for, trainer_logprobs
from arl.train.update import mismatch_tail

pytestmark = pytest.mark.anyio


class DroppedPushEngine(HFEngine):
    """Takes every weight push without an error and keeps serving the weights it started with."""

    async def _update_weights(self, named_tensors):
        list(named_tensors)


class UnloadedAdapterEngine(HFEngine):
    """Takes every LoRA adapter push without an error and never loads one."""

    async def _update_adapter(self, adapter):
        return None


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


async def test_a_correct_engine_passes_after_a_real_update_and_push(tmp_path, tiny_path):
    config = small_config(tmp_path, "steps=1")
    engine = HFEngine(tiny_path, max_model_len=1024)
    try:
        async with Trainer(config, engine=engine) as trainer:
            await trainer.setup()
            probe = trainer.canary
            assert probe is not None and probe.tolerance == FP32
            gen = await engine.generate(probe.prompt, probe.params)
            before = trainer_logprobs(trainer.model, probe.prompt, gen.token_ids)
            metrics = await trainer.step()
            after = trainer_logprobs(trainer.model, probe.prompt, gen.token_ids)
    finally:
        await engine.close()
    # The update moved the probe's log-probs far past the tolerance, so a dropped push could not pass.
    assert _gap(before, after) > 10 * FP32.max_abs
    # fp32 hf engine vs fp32 trainer: equal up to the engine's KV-cached vs the trainer's full forward.
    assert metrics["sync/canary_max_abs"] < 1e-4 and metrics["sync/canary_mean_abs"] < 1e-4
    assert metrics["timing/canary_s"] > 0
    # The rollout's own tokens agree the same way: no tail, nothing outside the clip band.
    assert metrics["train/logprob_gap_p99"] < 1e-4
    assert metrics["train/ratio_outside_clip_frac"] == 0.0


async def test_a_dropped_weight_push_stops_the_run_at_the_next_step(tmp_path, tiny_path):
    config = small_config(tmp_path, "steps=2")  # optim.lr=0.01: one step moves the probe by ~1
    engine = DroppedPushEngine(tiny_path, max_model_len=1024)
    try:
        async with Trainer(config, engine=engine) as trainer:
            await trainer.setup()  # the engine started from the same weights: nothing to see yet
            with pytest.raises(WeightSyncError) as err:
                await trainer.step()
            assert trainer.history == []  # nothing recorded, nothing saved from the stale step
    finally:
        await engine.close()
    message = str(err.value)
    assert "at step 1" in message and "pushing the full weights into the hf engine" in message
    assert "over the fp32 tolerance (max 0.01 / mean 0.002)" in message
    assert "a reload that kept the old weights" in message and "dtype mismatch" in message
    assert "canary_every=0" in message


async def test_a_lora_adapter_that_never_loads_is_caught(tmp_path, tiny_path):
    config = small_config(tmp_path, "steps=2", "lora.rank=8")
    engine = UnloadedAdapterEngine(tiny_path, max_model_len=1024)
    try:
        async with Trainer(config, engine=engine) as trainer:
            await trainer.setup()  # B = 0: the missing adapter changes nothing yet
            with pytest.raises(WeightSyncError, match="after pushing the LoRA adapter into the hf engine") as err:
                await trainer.step()
    finally:
        await engine.close()
    assert "the adapter never loaded" in str(err.value)


async def test_a_wrong_initial_load_is_caught_at_set_up(tmp_path, tiny_path):
    """An injected engine that serves other weights and drops the trainer's first push."""
    config = small_config(tmp_path)
    engine = DroppedPushEngine(tiny_path, max_model_len=1024)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in engine.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    try:
        with pytest.raises(WeightSyncError, match="failed at set-up: after pushing the full weights"):
            async with Trainer(config, engine=engine) as trainer:
                await trainer.setup()
    finally:
        await engine.close()


async def test_canary_every_sets_the_steps_it_checks(tmp_path):
    config = small_config(tmp_path, "steps=4", "canary_every=2")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.setup()
        checked: list[str] = []

        async def check(pushed, when):
            checked.append(when)
            return {"sync/canary_max_abs": 0.0, "sync/canary_mean_abs": 0.0}

        trainer.canary.check = check
        history = await trainer.train()
    assert checked == ["step 2", "step 4"]
    assert ["sync/canary_max_abs" in row for row in history] == [False, True, False, True]
    off = small_config(tmp_path / "off", "canary_every=0")
    async with Trainer(off, engine=scripted(off)) as trainer:
        await trainer.setup()
        assert trainer.canary is None


async def test_the_scripted_engine_skips_the_canary_and_says_so_once(tmp_path, caplog):
    config = small_config(tmp_path, "steps=2")
    engine = scripted(config)
    caplog.set_level(logging.INFO, logger="arl.train.canary")
    async with Trainer(config, engine=engine) as trainer:
        history = await trainer.train()
    assert not any(k.startswith("sync/") for row in history for k in row)
    said = [r.getMessage() for r in caplog.records if r.name == "arl.train.canary"]
    assert said == ["weight-sync canary off: the scripted engine's log-probs are made up (no model serves them)"]


async def test_an_engine_without_logprobs_turns_the_canary_off(tiny_tokenizer, caplog):
    class NoLogprobs:  # outside arl's contract: no name, no policy_version, no log-probs
        async def generate(self, prompt, params):
            return Generation([5] * params.max_tokens, [], "length", len(prompt))

    probe = SyncCanary(NoLogprobs(), None, tiny_tokenizer)
    caplog.set_level(logging.WARNING, logger="arl.train.canary")
    assert await probe.check() == {} and await probe.check() == {}
    assert [r.getMessage() for r in caplog.records] == ["weight-sync canary off: the engine returned 0 log-probs "
                                                        "for 16 tokens"]


def test_the_probe_is_a_chat_turn_and_the_tolerance_follows_the_precision(tiny_tokenizer):
    prompt = canary.probe_prompt(tiny_tokenizer)
    text = tiny_tokenizer.decode(prompt)
    assert canary.PROBE_MESSAGE in text and text.index(canary.PROBE_MESSAGE) > 0  # inside the template
    assert canary.probe_params().temperature == 0.0 and canary.probe_params().seed is not None
    assert tolerance_for("float32", "fp32") == FP32
    assert tolerance_for("float32", "bf16") == tolerance_for("bfloat16") == tolerance_for("float16") == BF16


def test_mismatch_tail_on_hand_made_tokens():
    # 1000 tokens, 20 of them off by 1: the mean gap (0.02) hides them, the p99 does not.
    engine = np.zeros(1000)
    trainer = engine.copy()
    trainer[:20] = -1.0
    tail = mismatch_tail(trainer, engine)
    assert tail["logprob_gap_p99"] == pytest.approx(1.0)
    assert tail["ratio_outside_clip_frac"] == pytest.approx(0.02)  # exp(-1) = 0.37 < 0.8
    # 99 exact tokens and one off by 2: the 0.99-quantile interpolates 1% of the way to it.
    trainer = np.zeros(100)
    trainer[0] = 2.0
    assert mismatch_tail(trainer, np.zeros(100))["logprob_gap_p99"] == pytest.approx(0.02)
    # An asymmetric band [0.8, 1.28]: ratios 0.75 and 1.3 leave it, 0.85 and 1.25 do not.
    ratios = np.array([0.75, 0.85, 1.25, 1.3])
    tail = mismatch_tail(np.log(ratios), np.zeros(4), clip_eps_low=0.2, clip_eps_high=0.28)
    assert tail["ratio_outside_clip_frac"] == 0.5
    assert mismatch_tail([], []) == {}  # no token, nothing measured: absent, not 0
    huge = mismatch_tail([0.0], [-1000.0])  # a ratio that overflows float64 still counts, as outside
    assert huge == {"logprob_gap_p99": 1000.0, "ratio_outside_clip_frac": 1.0}
    with pytest.raises(ValueError, match="against"):
        mismatch_tail(np.zeros(3), np.zeros(4))


@pytest.mark.parametrize("module", [canary, update], ids=lambda m: m.__name__)
def test_doctests(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0
