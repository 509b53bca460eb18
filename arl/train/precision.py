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

``auto`` (`resolve_precision`, once, when the trainer is built): bf16 where the trainer's device
multiplies bf16 matrices fast, else fp32, and an ``engine.dtype`` of ``policy`` follows it. Fast
means a CUDA GPU that supports bf16, or a CPU with bf16 instructions (x86 ``avx512_bf16`` or
``amx_bf16``, ARM ``bf16``). The choice matters most on CPUs: on a 2-core AMD EPYC with
AVX512-BF16 a 2048^2 bf16 matmul ran at 0.86 TFLOP/s against fp32's 0.21 and a SmolLM2 step took
46 s in bf16; on an AVX2-only CPU bf16 ran at 0.0009 TFLOP/s against fp32's 0.13 (~150x slower:
torch emulates it there) and the step took 133 s in fp32 (`benchmarks/step_floor.py`,
benchmarks/HISTORY.md "A step beside its compute floor").
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import attrs
import torch

from arl.config import PRECISIONS, TrainConfig

# /proc/cpuinfo flags of CPUs whose bf16 matmuls run natively (x86: AVX512-BF16, AMX; ARM: BF16).
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def bf16_is_fast(device: str | torch.device) -> bool:
    """Whether ``device`` multiplies bf16 matrices natively: a CUDA GPU that supports bf16, or a CPU
    whose /proc/cpuinfo lists one of `BF16_CPU_FLAGS` (where there is no /proc/cpuinfo: False)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & BF16_CPU_FLAGS)


def resolve_precision(config: TrainConfig, device: str | torch.device | None = None) -> TrainConfig:
    """``config`` with ``optim.precision: auto`` made bf16 or fp32 (`bf16_is_fast` on ``device``,
    by default the trainer's: CUDA if there is one, else the CPU), and ``engine.dtype: policy``
    made bfloat16 or float32 to match. Anything else is returned as it is.

    >>> from arl.config import structure
    >>> c = structure({"optim": {"precision": "bf16"}, "engine": {"dtype": "policy"}})
    >>> r = resolve_precision(c)
    >>> r.optim.precision, r.engine.dtype
    ('bf16', 'bfloat16')
    >>> resolve_precision(TrainConfig()).engine.dtype      # the defaults: nothing to resolve
    'float32'
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = config.optim.precision
    if precision == "auto":
        precision = "bf16" if bf16_is_fast(device) else "fp32"
        config = attrs.evolve(config, optim=attrs.evolve(config.optim, precision=precision))
    if config.engine.dtype == "policy":
        dtype = "bfloat16" if precision == "bf16" else "float32"
        config = attrs.evolve(config, engine=attrs.evolve(config.engine, dtype=dtype))
    return config


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
    if precision == "auto":
        raise ValueError("precision='auto' is resolved when the trainer is built (resolve_precision); "
                         "resolve it before computing with it")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}")


__all__ = ["BF16_CPU_FLAGS", "bf16_is_fast", "forward_precision", "resolve_precision", "weights_dtype"]
