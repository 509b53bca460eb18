"""The weight-sync canary: after a weight push, the engine must serve the policy being trained.

    canary = SyncCanary(engine, model, tokenizer, precision="fp32", engine_dtype="float32")
    metrics = await canary.check(pushed="full weights", when="step 3")   # or raises WeightSyncError

A push that silently does not land (a reload that kept the old weights, an adapter that never
loaded, a dtype the tolerances do not expect) does not crash anything: the rollout keeps sampling
from the old policy, the importance weights quietly absorb the gap, and a run can train for hours
on a policy the engine never serves. The canary makes that a typed error at the first push it
affects. The probe is fixed for the whole run:

- the prompt: the chat-template rendering of one short user message (`PROBE_MESSAGE`), so it is
  meaningful text for every tokenizer (plain encoding where the tokenizer has no template);
- the engine: ``PROBE_TOKENS`` greedy tokens (``temperature=0``, ``ignore_eos``, a fixed request seed
  so that the probe draws nothing from the engine's generator and the rollouts stay reproducible)
  and the log-prob it reports for each;
- the trainer: a teacher-forced forward of the same prompt + tokens through the trainer's model (the
  adapter on, under LoRA; in ``optim.precision``, as the update computes them), in a worker thread.

Greedy log-probs are the raw distribution's (temperature 1): arl's engines report the log-prob of
the distribution a token was chosen from, and greedy chooses from the unscaled logits (hf's sampler
and vLLM's ``processed_logprobs`` agree; `arl.engine.base.SamplingParams`). So the trainer side is
computed at temperature 1 too, and the two are compared like with like.

The gap must stay within the backend's numerical tolerance (`tolerance_for`): fp32 engines match the
trainer to ~1e-5 on the CPU, so `FP32` is loose only against GPU kernels' accumulation orders; bf16
(an engine in bf16/fp16, or ``optim.precision: bf16``) uses the bounds tests/engine/test_bf16.py
measured. A dropped push misses either by orders of magnitude once the policy has moved.

The scripted engine's log-probs are made up, so the canary switches itself off there (one log
line); so does an engine whose generations carry no log-probs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from arl.engine.base import SamplingParams

log = logging.getLogger(__name__)

PROBE_MESSAGE = "Describe what you see in one short sentence."
PROBE_TOKENS = 16  # enough tokens that one wrong weight shows; one forward pass on the trainer side


class WeightSyncError(RuntimeError):
    """The engine does not serve the trainer's policy after a weight push (`SyncCanary.check`)."""


@attrs.frozen
class Tolerance:
    """The largest gaps |engine - trainer| between two correct copies of one policy: per token
    (``max_abs``) and averaged over the probe (``mean_abs``)."""

    max_abs: float
    mean_abs: float
    label: str


# fp32 engines: 0.0000 (hf) and <= 2e-5 (vLLM CPU) on the tiny model's probe; the margin is for
# GPU kernels (their attention and matmul accumulation orders differ from the trainer's), and still
# ~100x below what one small update moves (lr 1e-2: ~1, lr 1e-4: ~0.1 on the tiny model).
FP32 = Tolerance(max_abs=1e-2, mean_abs=2e-3, label="fp32")
# bf16 rounding of every activation: tests/engine/test_bf16.py measured worst 0.075, mean 0.015 on the
# tiny model (CPU); SmolLM2-135M (30 layers, bf16 engine and bf16 autocast trainer, CPU) reached worst
# 0.42 on one token with mean 0.029 at step 19 of a correct run (2026-12-03), so one token's gap is noise
# at this size and the mean is the test: ~2x the largest mean measured. A dropped push measured worst
# 6.3, mean 3.2 on the tiny model.
BF16 = Tolerance(max_abs=1.0, mean_abs=0.06, label="bf16")

_FULL_PRECISION = ("float32", "float", "fp32")


def tolerance_for(engine_dtype: Any, precision: str = "fp32") -> Tolerance:
    """`BF16` when either side computes in less than fp32 (the engine's dtype is not float32:
    bfloat16, float16, or "auto", which may resolve to either; or ``optim.precision`` bf16), else
    `FP32`. ``engine_dtype`` is a name (``engine.dtype``) or a torch dtype.

    >>> tolerance_for("float32").label, tolerance_for("bfloat16").label, tolerance_for("auto").label
    ('fp32', 'bf16', 'bf16')
    >>> tolerance_for(torch.float32, precision="bf16").label
    'bf16'
    """
    name = str(engine_dtype).removeprefix("torch.")
    return FP32 if name in _FULL_PRECISION and precision == "fp32" else BF16


def logprob_gaps(engine_logprobs: Sequence[float], trainer_logprobs: Sequence[float]) -> tuple[float, float]:
    """(max, mean) of |engine - trainer| over the probe's tokens; (0.0, 0.0) for no tokens. A NaN on
    either side gives NaN, which no tolerance accepts.

    >>> logprob_gaps([-1.0, -2.0, -0.5], [-1.0, -2.5, -0.25])
    (0.5, 0.25)
    """
    a, b = np.asarray(engine_logprobs, dtype=np.float64), np.asarray(trainer_logprobs, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"{a.shape} engine log-probs against {b.shape} trainer log-probs")
    if a.size == 0:
        return 0.0, 0.0
    gap = np.abs(a - b)
    return float(gap.max()), float(gap.mean())


def probe_prompt(tokenizer: Any, message: str = PROBE_MESSAGE) -> list[int]:
    """The probe's prompt ids: ``message`` as a user turn in the tokenizer's chat template, with
    the generation prompt; the plain encoding of ``message`` for a tokenizer without a template."""
    if getattr(tokenizer, "chat_template", None):
        from arl.intercept.template import chat_ids

        return chat_ids(tokenizer, [{"role": "user", "content": message}])
    return [int(t) for t in tokenizer.encode(message, add_special_tokens=True)]


def probe_params(max_tokens: int = PROBE_TOKENS) -> SamplingParams:
    """Greedy, exactly ``max_tokens`` tokens; the seed only keeps the probe from drawing one from
    the engine's generator (hf draws a seed per unseeded request), which would shift the rollouts."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, seed=0)


def trainer_logprobs(model: Any, prompt: Sequence[int], tokens: Sequence[int], precision: str = "fp32") -> list[float]:
    """Teacher-forced log-probs of ``tokens`` after ``prompt`` under ``model`` at temperature 1, by
    the update's own code path (`arl.train.update.sequence_logprobs`), in eval mode (no dropout:
    the canary compares the policy, not one dropout draw of it). Blocking: call it in a thread."""
    from arl.train.update import sequence_logprobs

    ids = torch.tensor([list(prompt) + list(tokens)], dtype=torch.long)
    response = torch.zeros_like(ids)
    response[0, len(prompt):] = 1
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "position_ids": torch.arange(ids.shape[1]).unsqueeze(0), "response_mask": response,
             "logprobs": torch.zeros(ids.shape, dtype=torch.float32)}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            lp = sequence_logprobs(model, batch, [0], 1.0, 1, precision=precision)
    finally:
        model.train(was_training)
    return lp[0, len(prompt):].tolist()


def skip_reason(engine: Any) -> str | None:
    """Why the canary cannot check ``engine`` (None: it can)."""
    if getattr(engine, "name", None) == "scripted":
        return "the scripted engine's log-probs are made up (no model serves them)"
    if not callable(getattr(engine, "generate", None)):
        return f"{type(engine).__name__} has no generate()"
    return None


class SyncCanary:
    """The probe of one run (prompt fixed at construction) and its check after each push.

    ``engine_dtype`` is what the engine was configured with (``engine.dtype``); an engine that
    exposes its model's dtype (hf) is taken at its word when that is less than fp32.
    ``max_tokens``: the probe's length.
    """

    def __init__(self, engine: Any, model: Any, tokenizer: Any, *, precision: str = "fp32",
                 engine_dtype: Any = "float32", max_tokens: int = PROBE_TOKENS):
        self.engine, self.model, self.precision = engine, model, precision
        served = getattr(getattr(engine, "model", None), "dtype", None)
        if isinstance(served, torch.dtype) and served != torch.float32:
            engine_dtype = served
        self.tolerance = tolerance_for(engine_dtype, precision)
        self.params = probe_params(max_tokens)
        self.skip = skip_reason(engine)
        self.prompt = probe_prompt(tokenizer) if self.skip is None else []
        if self.skip is not None:
            log.info("weight-sync canary off: %s", self.skip)

    async def check(self, pushed: str = "weights", when: str = "") -> dict[str, float]:
        """Generate the probe at the engine, score it with the trainer's model, compare.

        Returns ``sync/canary_max_abs`` and ``sync/canary_mean_abs`` (nothing when the canary is
        off); raises `WeightSyncError` when a gap exceeds the tolerance. ``pushed`` and ``when``
        (what the last push moved, and at which point of the run) go into the error message.
        """
        if self.skip is not None:
            return {}
        gen = await self.engine.generate(self.prompt, self.params)
        tokens, engine_lps = list(gen.token_ids), list(getattr(gen, "logprobs", None) or [])
        if not tokens or len(engine_lps) != len(tokens):
            self.skip = f"the engine returned {len(engine_lps)} log-probs for {len(tokens)} tokens"
            log.warning("weight-sync canary off: %s", self.skip)
            return {}
        ours = await asyncio.to_thread(trainer_logprobs, self.model, self.prompt, tokens, self.precision)
        worst, mean = logprob_gaps(engine_lps, ours)
        tol = self.tolerance
        if not (worst <= tol.max_abs and mean <= tol.mean_abs):  # NaN fails too
            raise WeightSyncError(self._message(pushed, when, worst, mean, gen, engine_lps, ours))
        return {"sync/canary_max_abs": worst, "sync/canary_mean_abs": mean}

    def _message(self, pushed: str, when: str, worst: float, mean: float, gen: Any,
                 engine_lps: list[float], ours: list[float]) -> str:
        tol = self.tolerance
        name = getattr(self.engine, "name", type(self.engine).__name__)
        first = next((k for k, (a, b) in enumerate(zip(engine_lps, ours, strict=True))
                      if not abs(a - b) <= tol.max_abs), 0)
        served, current = getattr(gen, "policy_version", None), getattr(self.engine, "policy_version", None)
        version = (f" (the probe was served at policy version {served}, the engine is at {current})"
                   if served is not None and current is not None and served != current else "")
        if "adapter" in pushed:
            causes = ("the adapter never loaded or the engine still serves an older one (an engine started "
                      "without LoRA, requests not routed to the new adapter), an adapter scale (lora_alpha / r) "
                      "or target modules that differ from the trainer's, base weights under it that differ "
                      "from the trainer's base (a warm-started or resumed base that was not pushed)")
        else:
            causes = ("a reload that kept the old weights (a loader that skipped or renamed tensors, weights "
                      "copied into a replica the engine does not serve), tied weights loaded under one name only")
        causes += (f", or a dtype mismatch (the {tol.label} tolerance assumes engine.dtype and optim.precision "
                   "say what actually runs)")
        return (
            f"weight sync check failed{' at ' + when if when else ''}: after pushing {pushed} into the {name} "
            f"engine, its log-probs of the probe ({len(ours)} greedy tokens after a fixed chat prompt) differ "
            f"from the trainer's by max {worst:.4g} / mean {mean:.4g} per token, over the {tol.label} tolerance "
            f"(max {tol.max_abs:g} / mean {tol.mean_abs:g}); first bad token: {first} (engine {engine_lps[first]:.4f}, "
            f"trainer {ours[first]:.4f}){version}. The engine is not serving the policy being trained, so the "
            f"run stops rather than train on a stale policy. Likely causes: {causes}. "
            "(canary_every=0 switches the check off.)"
        )


__all__ = [
    "BF16", "FP32", "PROBE_MESSAGE", "PROBE_TOKENS", "SyncCanary", "Tolerance", "WeightSyncError", "logprob_gaps",
    "probe_params", "probe_prompt", "skip_reason", "tolerance_for", "trainer_logprobs",
]
