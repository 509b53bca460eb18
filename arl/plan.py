"""Memory planner: what training a model with arl needs on one GPU, and which settings fit.

    shape = model_shape("qwen2.5-1.5b")                       # known shape, a local HF dir, or a zoo name
    plan = plan_memory(shape, TrainSetting(lora_rank=16, dtype="bf16"), EngineSetting(concurrency=32))
    plan.total_bytes, plan.fits(80)                           # bytes; True/False on an 80 GiB GPU

arl runs the trainer and the vLLM engine in one process on one GPU, so both are summed:

    total = trainer + engine
    trainer = weights + master copy + gradients + AdamW states + KL reference
              + max(activations of one micro-batch, optimizer temporaries)
    engine  = weights (bf16) + KV cache + LoRA slots + overhead (a stated assumption)

Every term is a function below with its equation, its edge cases and a worked example. Bytes
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

from arl.model_shapes import KNOWN_SHAPES, ModelShape, model_shape, shape_from_config  # noqa: F401  (re-exported)

__all__ = [
    "ALL_LINEAR",
    "BYTES",
    "GiB",
    "KNOWN_SHAPES",
    "EngineSetting",
    "MemoryPlan",
    "ModelShape",
    "TrainSetting",
    "activation_bytes",
    "head_activation_bytes",
    "kv_cache_bytes",
    "layer_activation_bytes",
    "lora_parameter_count",
    "model_shape",
    "parameter_count",
    "plan_memory",
    "projection_shapes",
    "shape_from_config",
    "standard_settings",
]

GiB = 2**30
DType = Literal["fp32", "bf16"]
BYTES: dict[str, int] = {"fp32": 4, "bf16": 2}
ADAM_STATE_BYTES = 8  # AdamW's exp_avg and exp_avg_sq, fp32, per trainable parameter
# peft's "all-linear": every projection of every decoder layer (not the embedding / lm_head)
ALL_LINEAR: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# vLLM's memory beside weights and KV cache, per engine: the CUDA context (~0.5 GiB), the
# activations of its profiling forward pass (max_num_batched_tokens tokens), CUDA graphs and the
# sampler's buffers. An ASSUMPTION (vLLM logs its own figure at start-up as "non-torch memory"
# + "torch peak memory increase" + "CUDA graph"), not a measurement: check it on your GPU.
VLLM_OVERHEAD_BYTES = 2 * GiB


# ----------------------------------------------------------------------------------------------
# parameter counts


def projection_shapes(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear projection of one decoder layer.

    With Q = heads * head_dim and K = kv_heads * head_dim (grouped-query attention: K <= Q):
      q: H -> Q,  k: H -> K,  v: H -> K,  o: Q -> H,  gate: H -> I,  up: H -> I,  down: I -> H

    >>> projection_shapes(KNOWN_SHAPES["qwen2.5-7b"])["k_proj"]
    (3584, 512)
    """
    h, i = shape.hidden_size, shape.intermediate_size
    q, k = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return {"q_proj": (h, q), "k_proj": (h, k), "v_proj": (h, k), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def parameter_count(shape: ModelShape) -> int:
    """Number of parameters of the model.

        P = V*H                                   (embedding)
          + L * (sum_proj in*out + [Q + 2K]       (projections; q/k/v biases where the model has them)
                 + 2H)                            (the two RMSNorm weights of a layer)
          + H                                     (final norm)
          + V*H  unless the embeddings are tied   (lm_head)

    Worked example, Qwen2.5-0.5B (V 151936, H 896, L 24, Q 896, K 128, I 4864, tied):
    embedding 136,134,656; per layer 1,836,160 (attention) + 13,074,432 (MLP) + 1,792 (norms)
    = 14,912,384; total 136,134,656 + 24 * 14,912,384 + 896 = 494,032,768 (model card: 0.49B).

    >>> parameter_count(KNOWN_SHAPES["qwen2.5-0.5b"])
    494032768
    """
    v, h = shape.vocab_size, shape.hidden_size
    projections = projection_shapes(shape)
    per_layer = sum(n_in * n_out for n_in, n_out in projections.values()) + 2 * h
    if shape.attention_bias:
        per_layer += sum(projections[p][1] for p in ("q_proj", "k_proj", "v_proj"))
    return v * h + shape.num_layers * per_layer + h + (0 if shape.tie_word_embeddings else v * h)


def lora_parameter_count(shape: ModelShape, rank: int, targets: Sequence[str] = ALL_LINEAR) -> int:
    """Trainable parameters of a LoRA adapter of rank r on `targets` of every layer.

        P_lora = L * sum_{t in targets} r * (in_t + out_t)      (A: r x in, B: out x r)

    rank 0 or no targets give 0; an unknown target name is an error (a typo would plan nothing).

    >>> lora_parameter_count(KNOWN_SHAPES["tiny"], 8, ["q_proj"])   # 2 layers * 8 * (128 + 128)
    4096
    """
    projections = projection_shapes(shape)
    unknown = sorted(set(targets) - set(projections))
    if unknown:
        raise ValueError(f"unknown LoRA target modules {unknown}; known: {', '.join(projections)}")
    if rank < 0:
        raise ValueError(f"LoRA rank must be >= 0, got {rank}")
    return shape.num_layers * sum(rank * sum(projections[t]) for t in dict.fromkeys(targets))


# ----------------------------------------------------------------------------------------------
# activations and KV cache


# Which tensor each projection reads: the first norm's output, the attention output, the second
# norm's output, the MLP product. Targets that share an input share its saved copy in fp32.
_PROJECTION_INPUT = {"q_proj": "norm1", "k_proj": "norm1", "v_proj": "norm1", "o_proj": "attn",
                     "gate_proj": "norm2", "up_proj": "norm2", "down_proj": "product"}


def layer_activation_bytes(
    shape: ModelShape, dtype: DType, seq_len: int, *, padded: bool = True,
    lora_rank: int | None = None, lora_targets: Sequence[str] = ALL_LINEAR,
) -> int:
    """Bytes one decoder layer saves for the backward pass, per token: transformers' Llama/Qwen2
    layer with SDPA, as autograd saves it (checked tensor by tensor with saved_tensors_hooks on
    transformers 5 / torch 2.13). b = bytes of the activation dtype, Q = heads*head_dim,
    K = kv_heads*head_dim, T = seq_len.

      2 RMSNorms       2 * (4H + 4)      input in fp32 and 1/rms (pow and mul keep them, always)
      attention        bQ + 2bQ + bQ     q after RoPE; k and v repeated to Q heads (2bK unpadded:
                                         without a mask SDPA takes grouped k, v as they are); the
                                         output, which is also o_proj's input
                       + 4 heads         log-sum-exp
                       + bT              padded only: torch turns the boolean padding mask into a
                                         float (B, 1, T, T) mask per layer and keeps it
      SwiGLU MLP       3bI               gate (SiLU's input), silu(gate), up
    full fine-tune (weights need their inputs):
                       2bH + 2bH + bI    each norm's normalised input (for its weight) and output
                                         (for the projections), the product (down_proj's input)
    LoRA (frozen base: norms and base projections keep nothing; RoPE keeps nothing either way):
                       sum_t 4 in_t      each adapter's input, cast to fp32 by peft (a copy per
                                         target; in fp32 one per distinct input, o_proj's reuses
                                         the attention output)
                       + 4r per target   the adapter's rank-r hidden

    Worked example, tiny (H 128, Q 128, K 64, I 512, 4 heads) in fp32, padded rows of 256:
    norms 1032 + attention 512 + 1024 + 512 + 16 + 1024 + MLP 6144 + full 4096 = 14360.

    >>> layer_activation_bytes(KNOWN_SHAPES["tiny"], "fp32", 256)
    14360
    """
    b = BYTES[dtype]
    h, i = shape.hidden_size, shape.intermediate_size
    q, k = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    norms = 2 * (4 * h + 4)
    attention = b * q + (2 * b * q if padded else 2 * b * k) + b * q + 4 * shape.num_heads + (b * seq_len if padded else 0)
    mlp = 3 * b * i
    if lora_rank is None:
        return norms + attention + mlp + 4 * b * h + b * i
    targets = dict.fromkeys(lora_targets)
    projections = projection_shapes(shape)
    if dtype == "fp32":  # no cast: targets reading one tensor save it once; o_proj's is saved already
        inputs = {_PROJECTION_INPUT[t]: projections[t][0] for t in targets if t != "o_proj"}
        adapter_inputs = 4 * sum(inputs.values())
    else:
        adapter_inputs = sum(4 * projections[t][0] for t in targets)
    return norms + attention + mlp + adapter_inputs + 4 * lora_rank * len(targets)


def head_activation_bytes(shape: ModelShape, dtype: DType, *, lora_rank: int | None = None) -> int:
    """Bytes autograd saves per position whose logits the update keeps (`predicting_positions`):
    the language-model head and `token_logprobs` (checked with saved_tensors_hooks, as the layers).

      4V            the logits / T in fp32 (logsumexp and gather keep them)
      + 4 + 4 + 8   the log-sum-exp, the log-prob (index_copy keeps it) and the target id (int64)
      + bH          full fine-tune only: the kept hidden states, lm_head's input (for its weight)

    Worked example, tiny (V 697, H 128) in fp32, full fine-tune: 2788 + 16 + 512 = 3316.

    >>> head_activation_bytes(KNOWN_SHAPES["tiny"], "fp32")
    3316
    """
    return 4 * shape.vocab_size + 16 + (BYTES[dtype] * shape.hidden_size if lora_rank is None else 0)


def activation_bytes(
    shape: ModelShape, rows: int, seq_len: int, dtype: DType, *, checkpointing: bool, padded: bool = True,
    lora_rank: int | None = None, lora_targets: Sequence[str] = ALL_LINEAR, response_len: int | None = None,
    accumulating: bool = True,
) -> int:
    """Peak activation memory of one micro-batch, forward + backward: N = rows * seq_len tokens
    run through the layers, R = rows * response_len positions through the head.

        peak = max(N (L a_layer + a_pos) + max(head, lm_head, layer),  embedding)
        (checkpointing: L bH for L a_layer, and layer + N a_layer)

    The update asks the model for logits only at the positions that predict a response token
    (`arl.algo.predicting_positions`, the union over the micro-batch's rows: response_len per row;
    None = the whole row, the worst case, e.g. trajectory mode with turns spread over the row), so
    the vocabulary terms cost R positions and the layers all N tokens.
        a_pos  = 2b head_dim [+ 8 full fine-tune]  RoPE's cos and sin (shared by the layers); the
                                                   embedding's token ids (for its weight)
        a_norm = 4H + 4 [+ bH full fine-tune]      the final norm at every position (it runs before
                                                   the head picks its positions), as a layer's norm
        a_head = bV                                the logits (the loss loop holds them throughout)
               + `head_activation_bytes`           what autograd keeps of the head and log-probs
               + 3 * 4V                            the log-softmax's backward (fp32 temporaries)
    The backward runs head, layers, embedding; each moment below can be the peak:
        head      = N a_norm + R a_head                   the log-softmax's backward
        lm_head   = N a_norm + 2bV R + bVH                lm_head's backward computes its weight's
                                                          gradient (full fine-tune, tied or accumulating)
        layer     = R bV + N 3bI [+ bVH tied]             a layer's backward: its MLP's first gradients
        embedding = R bV + 2bVH + max(N bH, [bVH acc])    tied full fine-tune: the embedding's gradient
    With gradient accumulation (`accumulating`: a micro-batch after the first of an optimizer step,
    the worst case) a weight's gradient is a temporary beside the earlier micro-batches' .grad;
    without, the first one becomes .grad (counted in the plan's gradients). A tied lm_head's
    gradient waits in autograd's buffer until the embedding's joins it (bVH through the layers'
    backward, then the two and, accumulating, their sum). `benchmarks/memory.py --points peaks`
    checks every moment against a profiler's count of live tensor bytes (tiny and SmolLM2 cut to
    2 layers; fp32 and bf16, full and LoRA, tied and not, long and short responses): the head,
    lm_head and embedding moments agree within 0.4%; 3bI is an estimate (a layer's backward peaks
    at its MLP product's, or at a norm's; LoRA in bf16 peaks in the last layer's forward): the
    tiny model's layer moments lie within 8%, a share that shrinks with 24+ layers.

    a_layer = `layer_activation_bytes`. Qwen2.5 (V = 152k) costs ~2.6 MiB per kept position in
    bf16, more than all 24 layers of the 0.5B model per token. With LoRA autograd keeps 4H + 4 per
    token less than charged (the first layer's first norm: the frozen embedding's output needs no
    gradient). rows = 0 gives 0.

    Worked example, tiny (V 697, H 128, head_dim 32, tied) in fp32, full fine-tune, 4 padded rows x
    256 tokens, no checkpointing: a_layer 14360, a_pos 256 + 8 = 264, a_norm 516 + 512 = 1028,
    a_head 2788 + 3316 + 8364 = 14468, bVH 356,864. Whole rows (R = N = 1024): the head's backward,
    1024 * (2 * 14360 + 264 + 1028 + 14468) = 45,547,520. response_len 64 (R = 256): a layer's,
    1024 * 28984 + 256 * 2788 + 1024 * 6144 + 356,864 = 37,041,664 (head 1024 * 1028 + 256 * 14468
    = 4,756,480; lm_head 1,052,672 + 256 * 5576 + 356,864 = 2,836,992; embedding 4,092,928 in all).

    >>> tiny = KNOWN_SHAPES["tiny"]
    >>> activation_bytes(tiny, 4, 256, "fp32", checkpointing=False)
    45547520
    >>> activation_bytes(tiny, 4, 256, "fp32", checkpointing=False, response_len=64)
    37041664
    """
    response_len = seq_len if response_len is None else response_len
    if rows < 0 or seq_len < 0 or not 0 <= response_len <= seq_len:
        raise ValueError(f"need rows >= 0, seq_len >= 0 and 0 <= response_len <= seq_len, "
                         f"got {rows}, {seq_len} and {response_len}")
    if rows == 0:
        return 0
    b = BYTES[dtype]
    h, v = shape.hidden_size, shape.vocab_size
    full = lora_rank is None
    tied = full and shape.tie_word_embeddings
    tokens, kept = rows * seq_len, rows * response_len
    a_layer = layer_activation_bytes(shape, dtype, seq_len, padded=padded, lora_rank=lora_rank,
                                     lora_targets=lora_targets)
    a_pos = 2 * b * shape.head_dim + (8 if full else 0)
    a_norm = 4 * h + 4 + (b * h if full else 0)
    a_head = b * v + head_activation_bytes(shape, dtype, lora_rank=lora_rank) + 3 * 4 * v
    lm_head_grad = b * v * h  # lm_head's weight gradient (the embedding's too, when tied)
    head = tokens * a_norm + kept * a_head
    lm_head = tokens * a_norm + 2 * b * v * kept + lm_head_grad if full and (tied or accumulating) else 0
    layer = (kept * b * v + (lm_head_grad if tied else 0)
             + tokens * (3 * b * shape.intermediate_size + (a_layer if checkpointing else 0)))
    body = tokens * (shape.num_layers * (b * h if checkpointing else a_layer) + a_pos) + max(head, lm_head, layer)
    embedding = (kept * b * v + 2 * lm_head_grad + max(tokens * b * h, lm_head_grad if accumulating else 0)
                 if tied else 0)
    return max(body, embedding)


def kv_cache_bytes(shape: ModelShape, tokens: int, dtype: DType = "bf16") -> int:
    """vLLM's KV cache for `tokens` resident tokens (concurrency x context at worst).

        KV = 2 (K and V) * L * kv_heads * head_dim * bytes * tokens

    Grouped-query attention is why it is small: Qwen2.5-7B keeps 4 KV heads of 28.
    Worked example, Qwen2.5-7B in bf16: 2 * 28 * 4 * 128 * 2 = 57,344 bytes (56 KiB) per token.

    >>> kv_cache_bytes(KNOWN_SHAPES["qwen2.5-7b"], 1)
    57344
    """
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * BYTES[dtype] * tokens


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
    def total_bytes(self) -> int:
        return self.trainer_bytes + self.engine_bytes

    def fits(self, gpu_gib: float, usable: float = 0.9) -> bool:
        """total <= usable * GPU memory."""
        return self.total_bytes <= usable * gpu_gib * GiB

    def engine_fraction(self, gpu_gib: float) -> float:
        """The `gpu_memory_utilization` that gives vLLM its share and leaves the rest to the trainer
        (vLLM sizes its KV cache to fill that fraction; more concurrency needs a larger one)."""
        return self.engine_bytes / (gpu_gib * GiB)

    def breakdown(self) -> dict[str, int]:
        """Every term, in bytes, plus the sums (what the CLI and the benchmark print)."""
        terms = attrs.asdict(self, filter=lambda a, v: isinstance(v, int) and a.name not in ("parameters", "trainable"))
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
        lora_slots=lora_slots, engine_overhead=engine.overhead_bytes,
    )


def standard_settings(
    lora_ranks: Sequence[int] = (16, 64), *, gradient_checkpointing: bool = True, micro_batch: int = 1,
    seq_len: int = 4096, response_len: int | None = None, kl_reference: bool = False,
) -> list[TrainSetting]:
    """The README table's rows: full fp32, full bf16 + fp32 master, LoRA rank r in bf16 (each r)."""
    common = dict(gradient_checkpointing=gradient_checkpointing, micro_batch=micro_batch, seq_len=seq_len,
                  response_len=response_len, kl_reference=kl_reference)
    return [
        TrainSetting(dtype="fp32", **common),
        TrainSetting(dtype="bf16", fp32_master=True, **common),
        *(TrainSetting(lora_rank=r, dtype="bf16", **common) for r in lora_ranks),
    ]
