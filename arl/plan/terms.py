"""The memory planner's terms: bytes of parameters, activations and KV cache, one function each.

`arl.plan` adds them up for a training setting and decides what fits; these are the equations it
sums, each with its edge cases and a worked example (doctests), checked against what torch and
transformers really hold in tests/test_plan.py. Kept apart from the planning records so the
per-term arithmetic reads on its own, like the paper's appendix it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from arl.plan.shapes import KNOWN_SHAPES, ModelShape  # noqa: F401  (the doctests use KNOWN_SHAPES)

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
          + the vision tower, for a VLM           (`ModelShape.vision_params`)

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
    return v * h + shape.num_layers * per_layer + h + (0 if shape.tie_word_embeddings else v * h) + shape.vision_params


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


__all__ = [
    "ADAM_STATE_BYTES",
    "ALL_LINEAR",
    "BYTES",
    "DType",
    "GiB",
    "VLLM_OVERHEAD_BYTES",
    "activation_bytes",
    "head_activation_bytes",
    "kv_cache_bytes",
    "layer_activation_bytes",
    "lora_parameter_count",
    "parameter_count",
    "projection_shapes",
]
