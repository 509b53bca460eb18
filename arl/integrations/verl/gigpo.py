"""arl's advantages on verl batches: GiGPO per turn span, GRPO with arl's conventions.

GiGPO on verl rows. A verl row is one episode (`ArlAgentLoop` in traj or proxy mode) or one turn
of it (step mode); its ``extra_fields`` list the turns it holds: token span, index in the episode,
state key, step reward, action validity. `token_advantages` flattens the batch into one step-row
per turn, calls `arl.algo.gigpo` (nothing re-derived here), and writes each turn's advantage onto
that turn's generated tokens (its span times the response mask); bridge, end-of-turn and padding
tokens get 0. The group is verl's prompt ``uid`` (the n sessions of one dataset row played the same
seed), the trajectory the session (``traj_ids``: all the rows of one episode).

How it plugs into verl 0.9.1: a registered estimator is called as ``fn(token_level_rewards,
response_mask, config, index=uid)``, no ``non_tensor_batch`` (verl passes that to its built-in
GDPO only), so it never sees the turns' state keys and spans. ``extra_fields`` do reach the batch
(legacy trainer: one ``non_tensor_batch`` column per key; v1 trainer: an ``extra_fields`` field
per row in TransferQueue). `arl.integrations.verl.trainer` (``trainer.v1.trainer_mode=arl_sync``,
verl's sync trainer otherwise) reads them, computes `token_advantages`, and runs verl's own
advantage step inside `pending_advantages`, where the registered ``arl_gigpo`` estimator returns
them. No fork, no monkeypatch.

Conventions (`GIGPO_DEFAULTS`): the GiGPO paper's code, verl-agent (`gigpo/core_gigpo.py` and its
Sokoban launch): gamma 0.95, step weight 1, ``mean_norm``, episode statistics over step rows
(``compute_mean_std_cross_steps=True``), a singleton episode group passes its raw score, an invalid
action costs 0.1 (``invalid_action_penalty_coef``). arl's own trainer defaults differ
(``episode_stats="episodes"``, ``singleton="zero"``, no penalty); ``+algorithm.arl_gigpo.<name>=``
overrides any of them (``norm`` is verl-agent's ``algorithm.gigpo.mode``, and ``mode`` is accepted
here under that name: `gigpo_options`). benchmarks/README.md ("GiGPO conventions") compares the two
on arl's trainer; the defaults stay verl-agent's, the paper's setting.

GRPO needs no trainer change: `arl_grpo` (arl's conventions, docs/reference.md §3.1: unbiased std,
singleton and constant groups give 0) is an ordinary registered estimator over the episode score.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from arl.algo.advantages import gigpo, grpo
from arl.integrations.verl.agent_loop import TURN_FIELDS, TURN_STEPS

# verl-agent's GiGPO (module docstring), as keywords of `arl.algo.gigpo`
GIGPO_DEFAULTS: dict[str, Any] = {
    "gamma": 0.95, "step_weight": 1.0, "norm": "mean_norm",
    "episode_stats": "steps", "singleton": "raw", "invalid_penalty": 0.1,
}

# The advantages the arl_sync trainer computed for the batch verl's advantage step is running on.
_PENDING: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("arl_gigpo_pending", default=None)


def gigpo_options(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`GIGPO_DEFAULTS` under ``+algorithm.arl_gigpo.*`` (a dict or an OmegaConf node).

    The keys are `arl.algo.gigpo`'s keywords, written by the user in verl's config. ``mode`` is
    taken for ``norm``: it is the name verl-agent's config gives it (``algorithm.gigpo.mode``), and
    the one this block used before arl called it norm (docs/architecture.md, "Glossary"), so a
    launch written either way keeps working. Both at once: ValueError.
    """
    if overrides is not None and hasattr(overrides, "_metadata"):
        from omegaconf import OmegaConf

        overrides = OmegaConf.to_container(overrides, resolve=True)
    overrides = dict(overrides or {})
    if "mode" in overrides:
        if "norm" in overrides:
            raise ValueError("algorithm.arl_gigpo got mode and norm: mode is verl-agent's name of norm; give only norm")
        overrides["norm"] = overrides.pop("mode")
    return {**GIGPO_DEFAULTS, **overrides}


@contextlib.contextmanager
def pending_advantages(advantages: torch.Tensor) -> Iterator[None]:
    """Let the registered ``arl_gigpo`` estimator return ``advantages`` [B, L] inside this block."""
    token = _PENDING.set(advantages)
    try:
        yield
    finally:
        _PENDING.reset(token)


def row_fields(non_tensor_batch: Mapping[str, Any], size: int) -> list[dict[str, Any]]:
    """Each row's arl extra fields, from either batch layout: one ``extra_fields`` dict per row (v1
    trainer) or one column per key (the legacy trainer's ``_postprocess``)."""
    if "extra_fields" in non_tensor_batch:
        return [dict(x) for x in non_tensor_batch["extra_fields"]]
    missing = [k for k in (*TURN_FIELDS, "arl_episode_score") if k not in non_tensor_batch]
    if missing:
        raise KeyError(f"batch has no arl extra fields {missing}: were the rows played by ArlAgentLoop?")
    keys = [k for k in non_tensor_batch if k.startswith("arl_")]
    return [{k: non_tensor_batch[k][i] for k in keys} for i in range(size)]


def token_advantages(
    response_mask: torch.Tensor,
    fields: Sequence[Mapping[str, Any]],
    group_ids: Sequence[Any],
    traj_ids: Sequence[Any] | None = None,
    **gigpo_options: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GiGPO advantages, one per response token: (advantages [B, L], stats).

    Row i's turn t spans response positions [s, e): A(i, t) from `arl.algo.gigpo` over every
    turn of the batch is written to positions s..e-1 where response_mask is 1. ``traj_ids``
    (default: the row index) name the trajectories: the rows of one step-mode episode share
    one, and each turn's step index is its ``arl_turn_steps`` entry (default: its place in the
    row). ``gigpo_options`` go to `arl.algo.gigpo` (gamma, step_weight, norm, invalid_penalty,
    episode_stats, singleton, ...).
    """
    n = response_mask.shape[0]
    if not len(fields) == len(group_ids) == n:
        raise ValueError(f"one entry per row: mask {n}, fields {len(fields)}, group_ids {len(group_ids)}")
    traj_ids = list(range(n)) if traj_ids is None else list(traj_ids)

    rows, spans, scores, rewards, groups, trajs, steps, states, valid = ([] for _ in range(9))
    for i, f in enumerate(fields):
        turn_spans = list(f["arl_turn_spans"])
        turn_steps = list(f.get(TURN_STEPS, range(len(turn_spans))))
        for t, span in enumerate(turn_spans):
            rows.append(i)
            spans.append((int(span[0]), int(span[1])))
            scores.append(float(f["arl_episode_score"]))
            rewards.append(float(f["arl_step_rewards"][t]))
            groups.append(_key(group_ids[i]))
            trajs.append(_key(traj_ids[i]))
            steps.append(int(turn_steps[t]))
            states.append(str(f["arl_state_keys"][t]))
            valid.append(bool(f["arl_action_valid"][t]))

    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    if not rows:
        return out, {}
    adv, stats = gigpo(scores, rewards, groups, trajs, steps, states, action_valid=valid, **gigpo_options)
    mask = response_mask.to(torch.float32)
    for row, (start, end), a in zip(rows, spans, adv, strict=True):
        out[row, start:end] = float(a) * mask[row, start:end]
    return out, stats


def grpo_token_advantages(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Sequence[Any], **grpo_options: Any
) -> torch.Tensor:
    """arl's GRPO on trajectory rows: R = the row's summed token rewards, A = `arl.algo.grpo`
    over rows sharing ``index`` (verl's uid), broadcast to the response mask."""
    scores = token_level_rewards.sum(dim=-1).detach().cpu().numpy().astype(np.float64)
    adv = grpo(scores, [_key(x) for x in index], **grpo_options)
    return torch.as_tensor(adv, dtype=torch.float32, device=response_mask.device).unsqueeze(-1) * response_mask


def _key(x: Any) -> Any:
    """A hashable group / trajectory key (numpy scalars become Python values)."""
    return x.item() if hasattr(x, "item") else x


def register_estimators() -> None:
    """Register ``arl_grpo`` (and ``arl_gigpo``, computed by the ``arl_sync`` trainer) with verl.

    Idempotent. Must run in the process that computes advantages (the v1 trainer's TaskRunner):
    `arl.integrations.verl.setup_verl` does it there through Ray's worker_process_setup_hook.
    """
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    if "arl_grpo" not in ADV_ESTIMATOR_REGISTRY:
        register_adv_est("arl_grpo")(_arl_grpo_estimator)
    if "arl_gigpo" not in ADV_ESTIMATOR_REGISTRY:
        register_adv_est("arl_gigpo")(_arl_gigpo_estimator)


def _arl_grpo_estimator(token_level_rewards, response_mask, config=None, index=None, **_: Any):
    norm = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    adv = grpo_token_advantages(token_level_rewards, response_mask, index, std_normalize=norm)
    return adv, adv


def _arl_gigpo_estimator(token_level_rewards, response_mask, config=None, index=None, **_: Any):
    """The advantages `pending_advantages` holds, on the mask verl passes (rollout rejection
    sampling may have zeroed rows of it since they were computed)."""
    adv = _PENDING.get()
    if adv is None:
        raise RuntimeError(
            "algorithm.adv_estimator=arl_gigpo needs the turns' state keys, which verl does not pass to a "
            "registered estimator: run the v1 trainer with trainer.v1.trainer_mode=arl_sync "
            "(arl.integrations.verl.trainer)"
        )
    if tuple(adv.shape) != tuple(response_mask.shape):
        raise ValueError(f"arl_gigpo advantages {tuple(adv.shape)} do not match the batch {tuple(response_mask.shape)}")
    adv = adv.to(device=response_mask.device, dtype=torch.float32) * response_mask
    return adv, adv
