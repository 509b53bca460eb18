"""The policy update: one rollout batch -> optimizer steps (blocking torch work; the trainer runs
it in a worker thread).

    metrics = policy_update(model, optimizer, batch, advantages, algo=c.algo, optim=c.optim,
                            rng=rng, ref_model=ref)

For each of ``optim.epochs``, the rows are shuffled and split into ``optim.mini_batches``; each
mini-batch is one optimizer step, its gradient accumulated over micro-batches of
``optim.micro_batch_size`` rows, each cut to its longest real length, and the model's head runs only where a logit predicts a
response token (`predicting_positions`: prompt logits never enter the loss). The loss is
`arl.algo.policy_loss` (PPO-clip, k3 KL to ``ref_model``, entropy bonus, truncated importance
weight between the trainer's and the engine's log-probs), normalised over the whole mini-batch
(`loss_normalizers`) so accumulation equals one big batch. A step with a non-finite gradient norm
is skipped, not applied. Each token is scored at the temperature it was drawn at (the batch's
per-token ``temperatures``, `arl.rollout.records.token_temperatures`), so the ratio and the
importance weight compare the distribution the engine sampled with the trainer's same one. The
entropy of the policy on the response tokens is measured on every step, with gradient only when
the bonus is on (``algo.entropy_coef > 0``). Every forward pass runs in ``optim.precision`` (`arl.train.precision`: bf16
autocast for full fine-tuning; the log-probs are fp32 from the logits in every precision).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from arl.algo import entropy_from_logits, loss_normalizers, policy_loss, predicting_positions, token_logprobs
from arl.train.precision import forward_precision

log = logging.getLogger(__name__)

_ROW_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask", "logprobs", "temperatures")


def policy_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, Any],
    advantages: np.ndarray,
    *,
    algo: Any,
    optim: Any,
    rng: np.random.Generator,
    ref_model: Any = None,
    temperature: float = 1.0,
) -> dict[str, float]:
    """Optimizer steps on one collated batch (`arl.rollout.collate`); returns ``train/*`` metrics.
    ``advantages``: one per sample (B,), or one per token (B, L), aligned with the batch's rows.
    ``temperature`` scores the tokens of a batch that carries no per-token ``temperatures``."""
    device = next(model.parameters()).device
    n = batch["input_ids"].shape[0]
    if "temperatures" not in batch:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (a greedy draw is scored at 1), got {temperature}")
        batch = {**batch, "temperatures": torch.full(batch["input_ids"].shape, float(temperature))}
    adv = torch.tensor(advantages, dtype=torch.float32, device=device)
    if adv.dim() == 2:  # one per token (GiGPO on trajectory samples): aligned with the padded input_ids
        width = batch["input_ids"].shape[1]
        if adv.shape[1] > width:
            raise ValueError(f"per-token advantages are {adv.shape[1]} wide, the batch's rows {width}")
        adv = torch.nn.functional.pad(adv, (0, width - adv.shape[1]))
    # PPO's "old" policy is the trainer's own log-probs of the sampled tokens before the update.
    # With one optimizer step per rollout they equal the current ones (ratio == 1, plain policy
    # gradient), so the extra forward pass is skipped and each micro-batch detaches its own.
    single_step = optim.mini_batches == 1 and optim.epochs == 1
    precision = optim.precision
    with torch.no_grad():
        old = None if single_step else sequence_logprobs(model, batch, range(n), None, optim.micro_batch_size,
                                                          precision=precision)
        ref = (sequence_logprobs(ref_model, batch, range(n), None, optim.micro_batch_size, precision=precision)
               if ref_model else None)
    mask = batch["response_mask"]
    trained = [p for group in optimizer.param_groups for p in group["params"]]  # a LoRA run: the adapter only
    metrics: dict[str, list[float]] = {}
    # with one optimizer step per rollout the old policy is the current one: these four are 0 or 1
    # by arithmetic, not measurements, so they are not reported (measured or absent)
    by_arithmetic = ("approx_kl", "clip_frac", "ratio_mean", "ratio_max") if single_step else ()
    tail: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])  # (trainer, engine) per response token
    skipped = 0
    for epoch in range(optim.epochs):
        for mini in np.array_split(rng.permutation(n), optim.mini_batches):
            norms = loss_normalizers(mask[mini])
            optimizer.zero_grad(set_to_none=True)
            mini_loss = 0.0  # each micro-batch's loss is its share of the mini-batch's: they add up
            for start in range(0, len(mini), optim.micro_batch_size):
                idx = mini[start : start + optim.micro_batch_size]
                rows = rows_of(batch, idx, device)
                keep = predicting_positions(rows["response_mask"])
                with forward_precision(model, precision):  # the backward needs no context
                    logits = response_logits(model, rows, keep)
                logp = token_logprobs(logits, rows["input_ids"], rows["temperatures"], positions=keep)
                width = logp.shape[1]
                # measured always (the first curve to read for collapse); differentiated only for the bonus
                with torch.set_grad_enabled(algo.entropy_coef > 0 and torch.is_grad_enabled()):
                    entropy = entropy_from_logits(logits, rows["temperatures"], positions=keep, length=width)
                loss, m = policy_loss(
                    logp, logp.detach() if old is None else old[idx, :width].to(device),
                    adv[idx] if adv.dim() == 1 else adv[idx, :width],
                    rows["response_mask"],
                    clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high, dual_clip=algo.dual_clip,
                    agg=algo.agg, ref_logprobs=None if ref is None else ref[idx, :width].to(device),
                    kl_coef=algo.kl_coef, entropy=entropy, entropy_coef=algo.entropy_coef,
                    engine_logprobs=rows["logprobs"], is_cap=algo.is_cap, is_level=algo.is_level, **norms,
                )
                loss.backward()
                if epoch == 0:  # the old policy is the same in every epoch: each token once
                    on = rows["response_mask"].bool()
                    behind = logp.detach() if old is None else old[idx, :width].to(device)
                    tail[0].append(behind[on].cpu())
                    tail[1].append(rows["logprobs"][on].float().cpu())
                mini_loss += float(m.pop("loss"))
                for k, val in m.items():
                    if k not in by_arithmetic:
                        metrics.setdefault(k, []).append(float(val))
            metrics.setdefault("loss", []).append(mini_loss)
            grad_norm = torch.nn.utils.clip_grad_norm_(trained, optim.grad_clip or float("inf"))
            if not torch.isfinite(grad_norm):  # a NaN/inf update would poison the policy: skip it
                log.error("skipping an update with non-finite gradient norm %s", float(grad_norm))
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            metrics.setdefault("grad_norm", []).append(float(grad_norm))
            optimizer.step()
    out = {f"train/{k}": float(np.mean(v)) for k, v in metrics.items()}
    out.update({f"train/{k}": v for k, v in mismatch_tail(
        torch.cat(tail[0]).numpy() if tail[0] else np.zeros(0), torch.cat(tail[1]).numpy() if tail[1] else np.zeros(0),
        clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high, is_cap=algo.is_cap).items()})
    out.update({"train/skipped_updates": float(skipped), "train/num_samples": float(n),
                "train/num_response_tokens": float(mask.sum())})
    return out


def mismatch_tail(trainer_logprobs: Any, engine_logprobs: Any, *, clip_eps_low: float = 0.2,
                  clip_eps_high: float = 0.2, q: float = 0.99, is_cap: float | None = None) -> dict[str, float]:
    """The tail of the trainer/engine log-prob mismatch, over response tokens (1-D, one per token).

    The mean gap (``train/logprob_gap``) hides the few tokens where the two disagree most, and those
    are the ones the importance weight truncates or PPO's clip zeroes. So, besides it:

      logprob_gap_p99          q-quantile of |trainer - engine| (numpy's linear interpolation)
      ratio_outside_clip_frac  fraction of tokens whose ratio exp(trainer - engine) lies outside
                               [1 - clip_eps_low, 1 + clip_eps_high]: already "clipped" before the
                               update has moved the policy at all

    With ``is_cap`` (``algo.is_cap``: the loss weights each token by the truncated importance weight
    w = min(exp(trainer - engine), is_cap)), the weight's tails too, token level, before truncation:

      is_weight_p01, is_weight_p99   the (1 - q)- and q-quantiles of exp(trainer - engine)
      is_weight_capped_frac          fraction of tokens whose weight the cap truncates (w > is_cap)

    Tokens sampled by an older policy (a partial rollout's carried episodes, an overlapped step)
    move these tails; a growing capped fraction says the correction is discarding signal.

    ``trainer_logprobs`` are the trainer's log-probs of the sampled tokens before the update (PPO's
    old policy), ``engine_logprobs`` the engine's, at the same temperature. No tokens: nothing to
    measure, so no keys.

    Gaps [0, 0, 0.5, 1]: the 0.99-quantile lies 97% of the way from 0.5 to 1; ratios exp(0.5) = 1.65
    and exp(-1) = 0.37 leave [0.8, 1.2]:

    >>> {k: round(v, 4) for k, v in mismatch_tail([0.0, -1.0, -2.0, -3.0], [0.0, -1.0, -2.5, -2.0]).items()}
    {'logprob_gap_p99': 0.985, 'ratio_outside_clip_frac': 0.5}

    Weights 1, 1, 1.65, 0.37 under a cap of 1.5: one of four is truncated:

    >>> tail = mismatch_tail([0.0, -1.0, -2.0, -3.0], [0.0, -1.0, -2.5, -2.0], is_cap=1.5)
    >>> round(tail["is_weight_p99"], 3), round(tail["is_weight_p01"], 3), tail["is_weight_capped_frac"]
    (1.629, 0.387, 0.25)
    """
    ours = np.asarray(trainer_logprobs, dtype=np.float64)
    theirs = np.asarray(engine_logprobs, dtype=np.float64)
    if ours.shape != theirs.shape or ours.ndim != 1:
        raise ValueError(f"{ours.shape} trainer log-probs against {theirs.shape} engine log-probs")
    if ours.size == 0:
        return {}
    log_ratio = ours - theirs
    ratio = np.exp(np.minimum(log_ratio, 50.0))  # overflow only past any meaning; the fraction is unchanged
    outside = (ratio < 1.0 - clip_eps_low) | (ratio > 1.0 + clip_eps_high)
    out = {"logprob_gap_p99": float(np.quantile(np.abs(log_ratio), q)),
           "ratio_outside_clip_frac": float(outside.mean())}
    if is_cap is not None:
        out.update({"is_weight_p01": float(np.quantile(ratio, 1.0 - q)), "is_weight_p99": float(np.quantile(ratio, q)),
                    "is_weight_capped_frac": float((ratio > is_cap).mean())})
    return out


def sequence_logprobs(model: Any, batch: dict[str, Any], indices: Any, temperature: float | None,
                      micro_batch_size: int, *, precision: str = "fp32") -> torch.Tensor:
    """Log-probs of the response tokens of rows ``indices`` under ``model`` (forward in
    ``precision``), micro-batch by micro-batch, as a (B, L) fp32 CPU tensor aligned with the batch;
    0 wherever no row of the micro-batch has a response token (prompts, padding). Scored at the
    batch's per-token ``temperatures`` when it has them, else at ``temperature``."""
    device = next(model.parameters()).device
    idx = np.fromiter(indices, dtype=np.int64)
    out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
    for start in range(0, len(idx), micro_batch_size):
        rows = rows_of(batch, idx[start : start + micro_batch_size], device)
        keep = predicting_positions(rows["response_mask"])
        with forward_precision(model, precision):
            logits = response_logits(model, rows, keep)
        scale = rows["temperatures"] if "temperatures" in rows else temperature
        if scale is None:
            raise ValueError("a batch without per-token temperatures needs a temperature")
        lp = token_logprobs(logits, rows["input_ids"], scale, positions=keep)
        out[idx[start : start + len(lp)], : lp.shape[1]] = lp.cpu()
    return out


def response_logits(model: Any, rows: dict[str, torch.Tensor], keep: torch.Tensor) -> torch.Tensor:
    """The model's logits at positions ``keep`` only, (B, K, V): the language-model head runs on
    them alone (``logits_to_keep``, which every Hugging Face causal LM and PEFT wrapper accepts). Rows
    with images (`rows_of`'s ``pixel_values``) go to a Qwen2-VL-family forward with the engine's pixels,
    which computes the 3-D rotary positions from ``mm_token_type_ids`` as the engine's did."""
    if "pixel_values" in rows:  # images: the model computes its 3-D rotary positions from mm_token_type_ids
        return model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                     pixel_values=rows["pixel_values"], image_grid_thw=rows["image_grid_thw"],
                     mm_token_type_ids=rows["mm_token_type_ids"], logits_to_keep=keep).logits
    return model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                 position_ids=rows["position_ids"], logits_to_keep=keep).logits


def rows_of(batch: dict[str, Any], idx: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """Rows ``idx`` of the padded batch, cut to their longest real length (less padding compute); a
    batch with images (`arl.rollout.collate`) adds the rows' ``pixel_values`` and ``image_grid_thw``
    joined in row order and their ``mm_token_type_ids`` where any row taken has images."""
    idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
    width = int(batch["attention_mask"][idx].sum(dim=1).max())
    rows = {k: batch[k][idx, :width].to(device) for k in _ROW_KEYS if k in batch}
    pixels = [batch["pixel_values"][i] for i in idx.tolist()] if "pixel_values" in batch else []
    if any(p is not None for p in pixels):  # every image of the rows taken, in row order (the model's order)
        rows["pixel_values"] = torch.cat([p for p in pixels if p is not None]).to(device)
        rows["image_grid_thw"] = torch.cat([g for g in (batch["image_grid_thw"][i] for i in idx.tolist())
                                            if g is not None]).to(device)
        rows["mm_token_type_ids"] = batch["mm_token_type_ids"][idx, :width].to(device)
    return rows


__all__ = ["mismatch_tail", "policy_update", "response_logits", "rows_of", "sequence_logprobs"]
