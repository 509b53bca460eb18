"""Memory planner: what training a model with arl needs on one GPU, and which settings fit.

    shape = model_shape("qwen2.5-1.5b")                       # known shape, a local HF dir, or a zoo name
    plan = plan_memory(shape, TrainSetting(lora_rank=16, dtype="bf16"), EngineSetting(concurrency=32))
    plan.total_bytes, plan.fits(80)                           # bytes; True/False on an 80 GiB GPU

arl runs the trainer and the vLLM engine in one process on one GPU, so both are summed:

    total = trainer + engine
    with engine.sleep_mode (the engine sleeps through the update: weights to host, KV cache freed),
    the larger of the two phases instead:
    total = max(trainer state + engine,  trainer + engine overhead)
    trainer = weights + master copy + gradients + AdamW states + KL reference
              + max(activations of one micro-batch, optimizer temporaries)
    engine  = weights (bf16) + KV cache + LoRA slots + overhead (a stated assumption)

Every term is a function in `arl.plan.terms` with its equation, its edge cases and a worked example. Bytes
everywhere; GPU sizes are GiB (2**30 bytes: nvidia-smi shows a "24 GB" card as ~24 GiB, an
"80 GB" A100/H100 as 80 GiB, a "141 GB" H200 as ~140 GiB). A setting *fits* when its total is at
most `usable` (default 0.9, vLLM's default gpu_memory_utilization) of the GPU: the rest is left
to the allocator's fragmentation and to what the estimate leaves out.

What the estimate leaves out, on purpose: the CUDA allocator's cached-but-free blocks, the
Python/torch runtime on the host, sequence packing (arl pads micro-batches), and attention
kernels that materialise the T x T score matrix (the math fallback; flash / memory-efficient
SDPA kernels are assumed). benchmarks/memory.py measures the trainer terms on CPU (RSS) and
prints them beside this prediction, and counts the live tensor bytes at each activation peak
(torch's profiler) against `activation_bytes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs

from arl.plan.shapes import ModelShape
from arl.plan.terms import (
    ADAM_STATE_BYTES,
    ALL_LINEAR,
    BYTES,
    VLLM_OVERHEAD_BYTES,
    DType,
    GiB,
    activation_bytes,
    kv_cache_bytes,
    lora_parameter_count,
    parameter_count,
    projection_shapes,
)

__all__ = ["EngineSetting", "MemoryPlan", "TrainSetting", "plan_memory", "standard_settings"]


# ----------------------------------------------------------------------------------------------
# settings and the plan


@attrs.frozen
class TrainSetting:
    """How the policy is trained: full fine-tune or LoRA, precision, micro-batch, checkpointing, and
    how many positions per row the head runs on."""

    lora_rank: int | None = None  # None: full fine-tune
    lora_targets: tuple[str, ...] = ALL_LINEAR
    dtype: DType = attrs.field(default="fp32", validator=attrs.validators.in_(BYTES))  # weights, activations
    fp32_master: bool = True  # full bf16 only: the optimizer updates an fp32 copy (bf16 steps lose small updates)
    gradient_checkpointing: bool = False
    micro_batch: int = attrs.field(default=1, validator=attrs.validators.ge(1))  # rows per forward/backward
    seq_len: int = attrs.field(default=4096, validator=attrs.validators.ge(1))  # padded tokens per row
    # positions per row whose logits predict a response token (the head runs on those alone);
    # None: the whole row, the worst case (trajectory mode: turns spread over the row)
    response_len: int | None = attrs.field(default=None)
    # several micro-batches per optimizer step: the later ones' weight gradients are temporaries
    # beside the earlier ones' .grad (the worst case; False: one micro-batch per step)
    accumulating: bool = True
    padded: bool = True  # rows of different lengths (arl right-pads them): a mask reaches SDPA
    kl_reference: bool = False  # a KL reference policy (algo.kl_coef > 0)
    device: Literal["cuda", "cpu"] = "cuda"  # decides AdamW's implementation (foreach on CUDA)

    @response_len.validator
    def _check_response_len(self, attribute: attrs.Attribute, value: int | None) -> None:
        if value is not None and not 0 <= value <= self.seq_len:
            raise ValueError(f"response_len must lie in [0, seq_len = {self.seq_len}], got {value}")

    @property
    def label(self) -> str:
        if self.lora_rank is not None:
            return f"LoRA r={self.lora_rank} {self.dtype}"
        if self.dtype == "bf16":
            return "full bf16 + fp32 master" if self.fp32_master else "full bf16"
        return "full fp32"


@attrs.frozen
class EngineSetting:
    """The vLLM engine beside the trainer; `None` in `plan_memory` plans the trainer alone."""

    dtype: DType = "bf16"
    concurrency: int = attrs.field(default=32, validator=attrs.validators.ge(1))  # max_num_seqs
    context: int = attrs.field(default=4096, validator=attrs.validators.ge(1))  # max_model_len
    overhead_bytes: int = VLLM_OVERHEAD_BYTES
    lora_slots: int = 2  # max_loras: the serving adapter and the one being pushed
    sleep: bool = False  # engine.sleep_mode: weights, KV cache and adapters leave the GPU during the update


@attrs.frozen
class MemoryPlan:
    """A breakdown in bytes of one model x training setting x engine setting."""

    model: str
    setting: str
    parameters: int
    trainable: int
    # trainer
    weights: int
    master: int
    gradients: int
    optimizer: int
    reference: int
    activations: int
    optimizer_temp: int
    # engine (all 0 without one)
    engine_weights: int = 0
    kv_cache: int = 0
    lora_slots: int = 0
    engine_overhead: int = 0
    engine_sleeps: bool = False  # through the update (engine.sleep_mode): see total_bytes

    @property
    def trainer_bytes(self) -> int:
        """Persistent state plus the larger transient: activations (forward/backward) or the
        optimizer step's temporaries (the two never overlap: activations are freed by then)."""
        persistent = self.weights + self.master + self.gradients + self.optimizer + self.reference
        return persistent + max(self.activations, self.optimizer_temp)

    @property
    def engine_bytes(self) -> int:
        return self.engine_weights + self.kv_cache + self.lora_slots + self.engine_overhead

    @property
    def trainer_state_bytes(self) -> int:
        """What the trainer keeps between updates: no gradients (arl sets them to None after each
        optimizer step) and no activations, on the assumption that the trainer hands its cached
        blocks back (arl's trainer empties the CUDA cache before waking the engine)."""
        return self.weights + self.master + self.optimizer + self.reference

    @property
    def total_bytes(self) -> int:
        """The peak. The engine awake throughout: trainer + engine. Asleep through the update: the
        larger phase, the rollout (trainer state + engine) or the update (trainer + what vLLM
        keeps asleep, taken to be its overhead: CUDA context, allocator pools outside sleep mode).

        >>> p = MemoryPlan("m", "s", 10, 10, weights=40, master=0, gradients=40, optimizer=80, reference=0,
        ...                activations=100, optimizer_temp=40, engine_weights=20, kv_cache=200, engine_overhead=10)
        >>> p.total_bytes, attrs.evolve(p, engine_sleeps=True).total_bytes  # 260 + 230; max(120 + 230, 260 + 10)
        (490, 350)
        """
        if not self.engine_sleeps:
            return self.trainer_bytes + self.engine_bytes
        return max(self.trainer_state_bytes + self.engine_bytes, self.trainer_bytes + self.engine_overhead)

    def fits(self, gpu_gib: float, usable: float = 0.9) -> bool:
        """total <= usable * GPU memory."""
        return self.total_bytes <= usable * gpu_gib * GiB

    def engine_fraction(self, gpu_gib: float) -> float:
        """The `gpu_memory_utilization` that gives vLLM its share and leaves the rest to the trainer
        (vLLM sizes its KV cache to fill that fraction; more concurrency needs a larger one)."""
        return self.engine_bytes / (gpu_gib * GiB)

    def breakdown(self) -> dict[str, int]:
        """Every term, in bytes, plus the sums (what the CLI and the benchmark print)."""
        terms = attrs.asdict(self, filter=lambda a, v: type(v) is int and a.name not in ("parameters", "trainable"))
        return {**terms, "trainer": self.trainer_bytes, "engine": self.engine_bytes, "total": self.total_bytes}


def plan_memory(shape: ModelShape, train: TrainSetting, engine: EngineSetting | None = EngineSetting()) -> MemoryPlan:
    """The memory of training `shape` with `train` next to `engine` on one GPU.

    Full fine-tune, P parameters, b = bytes of the policy dtype:
        weights b*P;  master 4P if bf16 with an fp32 master copy (else 0);  gradients b*P;
        AdamW states 8P;  KL reference b*P (a second copy of the policy)
    LoRA, P_a adapter parameters (peft keeps adapters in fp32):
        weights b*P + 4*P_a;  gradients 4*P_a;  AdamW 8*P_a;  no master;  KL reference 0 (the
        base model with the adapter disabled); activations as `layer_activation_bytes` says.
    Gradients count during the forward and backward: with gradient accumulation over arl's
    micro-batches, the earlier micro-batches' gradients are alive during the later ones.
    Optimizer-step temporaries: CUDA's foreach AdamW holds one fp32 tensor per trainable parameter
    (sqrt of exp_avg_sq) for the whole list, the CPU's per-tensor AdamW two for the largest tensor
    (the sqrt and its quotient by the bias correction, alive together: a profiler's count);
    an fp32 master copy needs its gradients in fp32 too (4P, cast from the bf16 ones); the last
    micro-batch's logits (at its kept positions) are still alive during the step (the loss loop holds them).
    arl's trainer (``optim.precision: bf16``) realises "full bf16 + fp32 master" as fp32 weights under
    bf16 autocast: the bf16 weight copies live only through the forward/backward, beside fp32
    gradients (2P more than counted here then), and the optimizer step casts no gradients (4P less).
    Engine: weights in its dtype, KV cache for concurrency x context tokens, LoRA slots (max_loras
    adapters of the plan's rank in the engine dtype), and the stated overhead.

    Worked example, tiny, full fp32, 4 x 256 tokens, trainer only (P = 581,888: 89,216 embedding,
    2 x 246,272 per layer, 128 final norm): 4P + 4P + 8P = 9,310,208 bytes of state; activations
    45,547,520 (see `activation_bytes`) > temporaries 2 * 4 * 89,216 + 1024 * 697 * 4 = 3,568,640.

    >>> from arl.plan.shapes import KNOWN_SHAPES
    >>> p = plan_memory(KNOWN_SHAPES["tiny"], TrainSetting(micro_batch=4, seq_len=256, device="cpu"), None)
    >>> p.parameters, p.weights + p.gradients + p.optimizer, p.activations, p.trainer_bytes
    (581888, 9310208, 45547520, 54857728)
    """
    params = parameter_count(shape)
    b = BYTES[train.dtype]
    kept = train.micro_batch * (train.seq_len if train.response_len is None else train.response_len)
    activations = activation_bytes(shape, train.micro_batch, train.seq_len, train.dtype,
                                   checkpointing=train.gradient_checkpointing, padded=train.padded,
                                   lora_rank=train.lora_rank, lora_targets=train.lora_targets,
                                   response_len=train.response_len, accumulating=train.accumulating)
    projections = projection_shapes(shape)
    if train.lora_rank is None:
        trainable = params
        weights, master = b * params, (4 * params if train.dtype == "bf16" and train.fp32_master else 0)
        gradients, reference = b * trainable, (b * params if train.kl_reference else 0)
        largest = max(shape.vocab_size * shape.hidden_size, *(i * o for i, o in projections.values()))
    else:
        trainable = lora_parameter_count(shape, train.lora_rank, train.lora_targets)
        weights, master, gradients, reference = b * params + 4 * trainable, 0, 4 * trainable, 0
        largest = max((train.lora_rank * max(projections[t]) for t in train.lora_targets), default=0)
    optimizer_temp = 4 * (trainable if train.device == "cuda" else 2 * largest) + master + kept * shape.vocab_size * b
    plan = MemoryPlan(
        model=shape.name, setting=train.label, parameters=params, trainable=trainable,
        weights=weights, master=master, gradients=gradients, optimizer=ADAM_STATE_BYTES * trainable,
        reference=reference, activations=activations, optimizer_temp=optimizer_temp,
    )
    if engine is None:
        return plan
    eb = BYTES[engine.dtype]
    lora_slots = 0 if train.lora_rank is None else engine.lora_slots * eb * trainable
    return attrs.evolve(
        plan, engine_weights=eb * params, kv_cache=kv_cache_bytes(shape, engine.concurrency * engine.context, engine.dtype),
        lora_slots=lora_slots, engine_overhead=engine.overhead_bytes, engine_sleeps=engine.sleep,
    )


def standard_settings(
    lora_ranks: Sequence[int] = (16, 64), *, gradient_checkpointing: bool = True, micro_batch: int = 1,
    seq_len: int = 4096, response_len: int | None = None, kl_reference: bool = False,
) -> list[TrainSetting]:
    """The rows of docs/memory.md's table: full fp32, full bf16 + fp32 master, LoRA rank r in bf16 (each r)."""
    common = dict(gradient_checkpointing=gradient_checkpointing, micro_batch=micro_batch, seq_len=seq_len,
                  response_len=response_len, kl_reference=kl_reference)
    return [
        TrainSetting(dtype="fp32", **common),
        TrainSetting(dtype="bf16", fp32_master=True, **common),
        *(TrainSetting(lora_rank=r, dtype="bf16", **common) for r in lora_ranks),
    ]
