"""The policy loss (PPO-clip family) and the log-prob helpers that feed it.

All tensors are (B, L) and aligned with `collate()`: position i holds the quantity for token
input_ids[i], and `response_mask` marks the generated tokens at their own positions. Use
`token_logprobs` / `entropy_from_logits` on the model's logits to get that alignment (on all of
them, or on the `predicting_positions` of the response only).

Masked positions never reach the loss: every per-token term is selected with `torch.where`
from inputs that were zeroed there first, so padding holding garbage (even -inf) gives neither
a NaN loss nor a NaN gradient, and an all-zero mask gives a loss of exactly 0.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn.functional as F

__all__ = [
    "AGGS", "IS_LEVELS", "entropy_from_logits", "loss_normalizers", "policy_loss", "predicting_positions",
    "token_logprobs",
]

Agg = Literal["token-mean", "seq-mean-token-mean"]
AGGS: tuple[str, ...] = get_args(Agg)
IsLevel = Literal["token", "sequence"]
IS_LEVELS: tuple[str, ...] = get_args(IsLevel)

# exp() of a log-ratio beyond this overflows float32 long before it means anything; the KL and
# importance weights clamp their log-ratios here so one wild token cannot make the loss inf.
_MAX_LOG_RATIO = 20.0


# ----------------------------------------------------------------------------------------------
# log-probs and entropy from logits


def predicting_positions(response_mask: torch.Tensor) -> torch.Tensor:
    """The positions t whose logits predict a response token (response_mask[:, t+1] set in any row).

    Only these logits enter the loss, so the trainer asks the model for them alone (Hugging Face's
    ``logits_to_keep``) instead of all B x L x V: the language-model head and the fp32 log-softmax
    then cost response tokens, not prompt tokens. A step-mode FrozenLake batch has 8 response tokens
    in rows of ~54, so this skips ~85% of that work; for a 152k vocabulary it is the difference
    between the logits dominating the activations and not. Sorted, 1-D, int64.

    >>> predicting_positions(torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]))
    tensor([1, 2, 3])
    """
    return torch.nonzero(response_mask[:, 1:].bool().any(dim=0)).squeeze(-1)


def _scale(logits: torch.Tensor, temperature: float | torch.Tensor, at: torch.Tensor | slice) -> torch.Tensor:
    """``logits`` (B, K, V) in fp32 divided by the temperature of the tokens they predict: a scalar,
    or a (B, L) per-token tensor (token i's temperature at position i) read at positions ``at`` + 1."""
    if not isinstance(temperature, torch.Tensor):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        return logits.float() / temperature
    if bool((temperature <= 0).any()):
        raise ValueError("every token's temperature must be > 0 (a greedy draw is scored at 1)")
    per_token = temperature[:, 1:] if isinstance(at, slice) else temperature[:, at + 1]
    return logits.float() / per_token.to(logits.device).unsqueeze(-1)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float | torch.Tensor = 1.0,
                   positions: torch.Tensor | None = None) -> torch.Tensor:
    """log p(input_ids[:, i] | input_ids[:, :i]) at position i; position 0 gets 0.

    The model's logits at position t predict token t+1, so the shift happens here and the result
    lines up with `response_mask` (and with the engine's log-probs in `collate()['logprobs']`).
    Computed in float32 (bf16 log-softmax is too coarse to compare with the engine), after
    dividing by the sampling temperature, as the engine reports processed log-probs. The
    temperature is one scalar, or a (B, L) tensor aligned with ``input_ids`` (token i's own: each
    reply is scored at the temperature it was drawn at, `arl.rollout.records.token_temperatures`).

    With ``positions`` (from `predicting_positions`), ``logits`` is (B, K, V): the logits at those
    K positions only. The result is still (B, L): position t+1 gets the log-prob of the token the
    logits at t predict, every other position 0 (the gradient flows through the kept ones).

    >>> logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens
    >>> token_logprobs(logits, torch.tensor([[0, 1, 2]]))
    tensor([[ 0.0000, -1.3863, -1.3863]])
    >>> token_logprobs(logits[:, 1:2], torch.tensor([[0, 1, 2]]), positions=torch.tensor([1]))
    tensor([[ 0.0000,  0.0000, -1.3863]])

    Per-token temperatures: logits (0, log 2) over two tokens give token 1 probability 2/3 at
    T=1 and 4/5 at T=0.5:

    >>> two = torch.tensor([[[0.0, math.log(2)]] * 3])
    >>> token_logprobs(two, torch.tensor([[0, 1, 1]]), torch.tensor([[1.0, 1.0, 0.5]])).exp()
    tensor([[1.0000, 0.6667, 0.8000]])
    """
    if positions is None:
        if logits.shape[:2] != input_ids.shape:
            raise ValueError(f"logits {tuple(logits.shape)} do not match input_ids {tuple(input_ids.shape)}")
        scaled = _scale(logits[:, :-1], temperature, slice(None))
        targets = input_ids[:, 1:].unsqueeze(-1)
        logp = scaled.gather(-1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
        return F.pad(logp, (1, 0))  # nothing predicts the first token
    _check_kept(logits, input_ids, positions)
    scaled = _scale(logits, temperature, positions)
    targets = input_ids[:, positions + 1].unsqueeze(-1)
    logp = scaled.gather(-1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return logp.new_zeros(input_ids.shape).index_copy(1, positions + 1, logp)


def entropy_from_logits(logits: torch.Tensor, temperature: float | torch.Tensor = 1.0,
                        positions: torch.Tensor | None = None, length: int | None = None) -> torch.Tensor:
    """Entropy of the distribution that produced token i, at position i; position 0 gets 0.

    Same alignment and temperature as `token_logprobs`, so it can be masked by `response_mask`.
    H = -sum_v p_v log p_v, in float32. With ``positions``, ``logits`` holds only those positions
    (as in `token_logprobs`) and ``length`` is the row length L of the (B, L) result.

    >>> entropy_from_logits(torch.zeros(1, 2, 4))  # uniform over 4 tokens: log 4
    tensor([[0.0000, 1.3863]])
    >>> entropy_from_logits(torch.zeros(1, 1, 4), positions=torch.tensor([0]), length=3)
    tensor([[0.0000, 1.3863, 0.0000]])
    """
    if positions is None:
        logp = torch.log_softmax(_scale(logits[:, :-1], temperature, slice(None)), dim=-1)
        return F.pad(-(logp.exp() * logp).sum(dim=-1), (1, 0))
    if length is None:
        raise ValueError("entropy_from_logits(positions=...) needs the row length")
    _check_kept(logits, torch.empty(logits.shape[0], length), positions)
    logp = torch.log_softmax(_scale(logits, temperature, positions), dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return entropy.new_zeros(logits.shape[0], length).index_copy(1, positions + 1, entropy)


def _check_kept(logits: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
    """Kept logits must be one per position, and each position must predict a token inside the row."""
    if positions.dim() != 1 or logits.shape[:2] != (input_ids.shape[0], positions.numel()):
        raise ValueError(f"logits {tuple(logits.shape)} do not hold {tuple(positions.shape)} positions "
                         f"of {input_ids.shape[0]} rows")
    if positions.numel() and not (0 <= int(positions.min()) and int(positions.max()) < input_ids.shape[1] - 1):
        raise ValueError(f"positions must lie in [0, {input_ids.shape[1] - 1}): the last token predicts nothing")


# ----------------------------------------------------------------------------------------------
# aggregation and micro-batch normalisers


def loss_normalizers(response_mask: torch.Tensor) -> dict[str, int]:
    """The denominators of a whole (mini-)batch, for losses computed on its micro-batches.

    Pass them to every micro-batch's `policy_loss(..., **loss_normalizers(full_mask))` and sum
    (backward) the micro-batch losses without further scaling: the accumulated gradient then
    equals the full batch's, with either `agg` (token-mean, seq-mean-token-mean).

    >>> loss_normalizers(torch.tensor([[0, 1, 1], [0, 0, 0], [1, 0, 0]]))
    {'num_tokens_global': 3, 'num_seqs_global': 2}
    """
    mask = response_mask.bool()
    return {
        "num_tokens_global": int(mask.sum()),
        "num_seqs_global": int(mask.any(dim=-1).sum()),
    }


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg: Agg,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values (B, L) to a scalar over the masked tokens.

    token-mean:           sum_{b,t} m*x / N_tokens
    seq-mean-token-mean:  sum_b [ sum_t m*x / n_b ] / N_seqs   (sequences with n_b >= 1 tokens)

    N_tokens / N_seqs default to this batch's counts; pass the full batch's counts
    (`loss_normalizers`) to make micro-batch results sum to the full-batch value. A zero count
    gives 0, not NaN.
    """
    values = torch.where(mask, values, torch.zeros_like(values))
    if agg == "token-mean":
        denom = mask.sum() if num_tokens is None else num_tokens
        return values.sum() / _at_least_one(denom, values)
    if agg == "seq-mean-token-mean":
        seq_tokens = mask.sum(dim=-1)
        seq_means = values.sum(dim=-1) / seq_tokens.clamp(min=1).to(values.dtype)
        denom = (seq_tokens > 0).sum() if num_seqs is None else num_seqs
        return seq_means.sum() / _at_least_one(denom, values)
    raise ValueError(f"unknown agg {agg!r}; allowed: {', '.join(AGGS)}")


def _at_least_one(count: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp(min=1)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = int(mask.sum())
    return float(torch.where(mask, values, torch.zeros_like(values)).sum()) / count if count else 0.0


def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(values[mask].max()) if bool(mask.any()) else 0.0


# ----------------------------------------------------------------------------------------------
# the loss


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: float | None = None,
    agg: Agg = "token-mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    engine_logprobs: torch.Tensor | None = None,
    is_cap: float | None = None,
    is_level: IsLevel = "token",
    num_tokens_global: float | None = None,
    num_seqs_global: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip policy loss with optional dual-clip, k3 KL, entropy bonus and truncated IS.

    Per response token (A broadcast from (B,) to (B, L) when one advantage per sample):

      ratio  = exp(logp - old_logp)
      pg     = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
      dual   : where A < 0, pg = min(pg, -c * A)          (Ye et al. 2020; caps a huge ratio)
      IS     : pg = w * pg, w = min(exp(old_logp - engine_logp), C), detached
                 token level: per token; sequence level: exp(sum over the sequence's response
                 tokens) — the ratio of the sequence probabilities — shared by its tokens
      kl     = exp(ref - logp) - (ref - logp) - 1         (k3, >= 0, unbiased for KL(pi||ref))

      loss = agg(pg) + kl_coef * agg(kl) - entropy_coef * agg(entropy)

    `agg` is token-mean or seq-mean-token-mean (see `aggregate`); `num_tokens_global` /
    `num_seqs_global` replace this batch's denominators for gradient accumulation
    (`loss_normalizers`). Gradients flow only through `logprobs` (and `entropy`); old, reference
    and engine log-probs and the advantages are treated as constants.

    The IS correction is applied when both `engine_logprobs` and `is_cap` are given (use
    is_cap=math.inf for untruncated IS); `engine_logprobs` alone only logs the gap.

    Metrics (floats; token means over this call's response tokens, not the global normalisers):
    loss, pg_loss (the pg term aggregated with this call's own counts), clip_frac (tokens where
    the clipped branch is taken), dual_clip_frac, approx_kl (k3 of old vs new: mean(ratio - 1 -
    log ratio)), ratio_mean, ratio_max, num_tokens, num_seqs; and only where their term is
    computed (a metric is measured or absent): dual_clip_frac (``dual_clip``), kl
    (``ref_logprobs``), entropy (``entropy``, given with or without the bonus), logprob_gap (mean
    |old - engine|, ``engine_logprobs``), is_weight_mean (``is_cap`` too).

    With ratio == 1 the loss is the plain policy gradient -mean(A) (token-mean):

    >>> lp = torch.zeros(2, 3, requires_grad=True)
    >>> mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    >>> loss, m = policy_loss(lp, lp.detach(), torch.tensor([2.0, -1.0]), mask)
    >>> round(loss.item(), 4)  # -(2 + 2 - 1) / 3 tokens
    -1.0
    >>> loss, m = policy_loss(lp, lp.detach(), torch.tensor([2.0, -1.0]), mask, agg="seq-mean-token-mean")
    >>> round(loss.item(), 4)  # -(2 + (-1)) / 2 sequences
    -0.5
    """
    # ---- validate: wrong shapes silently broadcast into nonsense, so check them all up front
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, L), got {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("response_mask", response_mask),
        ("ref_logprobs", ref_logprobs),
        ("entropy", entropy),
        ("engine_logprobs", engine_logprobs),
    ):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like logprobs")
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(f"advantages must be (B,) or (B, L) = {tuple(shape)}, got {tuple(advantages.shape)}")
    if agg not in AGGS:
        raise ValueError(f"unknown agg {agg!r}; allowed: {', '.join(AGGS)}")
    if is_level not in IS_LEVELS:
        raise ValueError(f"unknown is_level {is_level!r}; allowed: {', '.join(IS_LEVELS)}")
    if clip_eps_low < 0 or clip_eps_high < 0 or clip_eps_low >= 1:
        raise ValueError(
            f"need 0 <= clip_eps_low < 1 and clip_eps_high >= 0, got {clip_eps_low}, {clip_eps_high}"
        )
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1 (it caps -A*ratio at -c*A for A < 0), got {dual_clip}")
    if kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError("kl_coef != 0 needs ref_logprobs")
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs entropy (entropy_from_logits)")
    if is_cap is not None and (engine_logprobs is None or not is_cap > 0):
        raise ValueError(f"is_cap needs engine_logprobs and a value > 0, got is_cap={is_cap}")

    mask = response_mask.bool()
    zero = torch.zeros_like(logprobs)

    def on_response(t: torch.Tensor) -> torch.Tensor:
        """Constants zeroed off the response, so padding garbage cannot become NaN."""
        return torch.where(mask, t.detach().to(logprobs.dtype), zero)

    adv = advantages.unsqueeze(-1).expand(shape) if advantages.dim() == 1 else advantages
    adv = on_response(adv)
    logp = torch.where(mask, logprobs, zero)
    old = on_response(old_logprobs)

    # ---- 1. importance ratio of the current policy to the one that collected the data
    #         (the clamp only bites at ratio > 5e8, where the update is lost anyway: it keeps the
    #         loss finite instead of inf, and such tokens get no gradient)
    log_ratio = logp - old
    ratio = torch.exp(log_ratio.clamp(max=_MAX_LOG_RATIO))

    # ---- 2. PPO clip: the pessimistic (larger-loss) of the unclipped and clipped objectives
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    clipped = mask & (pg_clipped > pg_unclipped)

    # ---- 3. dual clip: for A < 0 a huge ratio would give an unbounded loss; cap it at -c*A
    dual_clipped = torch.zeros_like(mask)
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual_clipped = mask & (adv < 0) & (pg > cap)
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)

    # ---- 4. truncated importance sampling: the data came from the engine, whose log-probs
    #         differ from the trainer's (numerics, sampling truncation); reweight towards the
    #         trainer's old policy, capped so rare tokens cannot dominate (TRL)
    is_weight = torch.ones_like(logprobs)
    gap = zero
    if engine_logprobs is not None:
        engine = on_response(engine_logprobs)
        gap = old - engine
        if is_cap is not None:
            log_cap = math.log(is_cap) if math.isfinite(is_cap) else _MAX_LOG_RATIO
            if is_level == "token":
                log_w = gap
            else:
                log_w = gap.sum(dim=-1, keepdim=True).expand(shape)
            is_weight = torch.where(mask, torch.exp(log_w.clamp(max=min(log_cap, _MAX_LOG_RATIO))), zero)
            pg = pg * is_weight

    loss = aggregate(pg, mask, agg, num_tokens=num_tokens_global, num_seqs=num_seqs_global)

    # ---- 5. KL to a frozen reference (k3 estimator: non-negative, low variance)
    kl = zero
    if ref_logprobs is not None:
        ref_log_ratio = (on_response(ref_logprobs) - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        kl = torch.exp(ref_log_ratio) - ref_log_ratio - 1.0
        if kl_coef != 0.0:
            loss = loss + kl_coef * aggregate(
                kl, mask, agg, num_tokens=num_tokens_global, num_seqs=num_seqs_global
            )

    # ---- 6. entropy bonus (subtracted: higher entropy lowers the loss)
    ent = zero
    if entropy is not None:
        ent = torch.where(mask, entropy, zero)
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * aggregate(
                ent, mask, agg, num_tokens=num_tokens_global, num_seqs=num_seqs_global
            )

    with torch.no_grad():
        metrics = {
            "loss": float(loss),
            "pg_loss": float(aggregate(pg, mask, agg)),
            "clip_frac": _masked_mean(clipped.float(), mask),
            "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "ratio_max": _masked_max(ratio, mask),
            "num_tokens": float(mask.sum()),
            "num_seqs": float(mask.any(dim=-1).sum()),
        }
        # measured or absent: a term that is not computed is not reported (a 0 would read as "measured, 0")
        if dual_clip is not None:
            metrics["dual_clip_frac"] = _masked_mean(dual_clipped.float(), mask)
        if engine_logprobs is not None:
            metrics["logprob_gap"] = _masked_mean(gap.abs(), mask)
            if is_cap is not None:
                metrics["is_weight_mean"] = _masked_mean(is_weight, mask)
        if ref_logprobs is not None:
            metrics["kl"] = _masked_mean(kl, mask)
        if entropy is not None:
            metrics["entropy"] = _masked_mean(ent, mask)
    return loss, metrics
