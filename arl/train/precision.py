"""Training precision (``optim.precision``): what the policy's weights are stored in, and what its
forward and backward compute in.

    model = AutoModelForCausalLM.from_pretrained(path, dtype=weights_dtype(precision, lora=True))
    with forward_precision(model, precision):
        logits = model(**rows).logits          # log-probs: arl.algo.token_logprobs, in fp32

``fp32`` (the default): every weight, gradient and optimizer state in float32; nothing changes.

``bf16``: bfloat16 compute, and an fp32 copy only of what the optimizer steps (a bf16 weight
loses every update smaller than ~1/256 of itself, so trained weights need fp32; frozen ones do not):

- LoRA: the frozen base is *stored* in bf16, with no fp32 copy at all (2 bytes per base parameter
  instead of 4). peft keeps the adapter, the only trained weights, in fp32 (its
  ``autocast_adapter_dtype``) and computes it on an fp32 cast of its input; the gradients and the
  AdamW moments are the adapter's, in fp32. No autocast: the base computes in bf16 natively, as a
  bf16 engine does.
- Full fine-tuning: the weights stay fp32 - they are the master copy the optimizer steps, with fp32
  gradients and moments - and the forward/backward runs under ``torch.autocast(bfloat16)`` on the
  model's device (CPU too): matmuls in bf16 on bf16 casts of the weights, norms, softmax and the
  residual stream in fp32. It saves activation memory and compute, not weight memory.

Either way the logits come out in bf16 and the log-probs are computed from them in fp32
(`arl.algo.token_logprobs`), the KL reference runs in the same precision as the policy (the base
with the adapter off under LoRA; an fp32 copy under the same autocast for full fine-tuning, so the
KL is exactly 0 before the first update), and checkpoints hold fp32 adapters / weights. On a GPU
the intended pairing is a bf16 engine (``engine.dtype: bfloat16``) with a bf16 policy.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from arl.config import PRECISIONS


def weights_dtype(precision: str, *, lora: bool) -> torch.dtype:
    """The dtype the policy's weights are loaded in: bf16 only for LoRA's frozen base (what the
    optimizer steps must be fp32: the adapter is made fp32 by peft, full weights stay fp32)."""
    _check(precision)
    return torch.bfloat16 if precision == "bf16" and lora else torch.float32


def forward_precision(model: Any, precision: str) -> contextlib.AbstractContextManager:
    """The context a forward pass of ``model`` runs in: bf16 autocast on its device when
    ``precision`` is bf16 and its weights are fp32 (full fine-tuning); nothing otherwise (fp32, or
    weights already stored in bf16, which compute in bf16 by themselves). The backward pass needs no
    context: autocast's casts are recorded in the graph."""
    _check(precision)
    weights = next(model.parameters())
    if precision == "fp32" or weights.dtype != torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(weights.device.type, dtype=torch.bfloat16)


def _check(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}")


__all__ = ["forward_precision", "weights_dtype"]
