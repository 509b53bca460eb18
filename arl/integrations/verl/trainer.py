"""``trainer.v1.trainer_mode=arl_sync``: verl's synchronous v1 trainer, GiGPO inputs read by arl.

Why a trainer class at all: a registered verl estimator is called with token rewards, the
response mask, the uid and the algorithm config only (`verl.trainer.ppo.ray_trainer.
compute_advantage`), never the rows' ``extra_fields``, so it cannot see the turns' state keys. The
v1 trainer's ``_compute_advantage(batch)`` is the one place that has the batch keys to read them.

What the class changes, and nothing else:
- ``arl_sync`` is only the name that selects this class (`verl.trainer.main_ppo` looks the mode up
  in verl's trainer registry). verl tests ``trainer_mode == "sync"`` in its base trainer (replay
  buffer class, ``gen_batch_size``, checkpoint and in-flight-prompt handling, the
  ``trainer.v1.<mode>`` section), so the constructor rewrites the mode to ``sync`` before verl
  reads it: from then on verl runs its own sync trainer.
- ``_compute_advantage`` with ``algorithm.adv_estimator=arl_gigpo`` reads each row's turns from
  TransferQueue, computes GiGPO per token (`arl.integrations.verl.gigpo.token_advantages`) and then
  runs verl's own ``_compute_advantage``, whose registered ``arl_gigpo`` estimator hands those
  advantages back (times the response mask verl passes it). So verl's rollout correction (IS
  weights, rejection sampling, its metrics), KL handling and write-back all run unchanged.
  Every other estimator is verl's code path untouched.

Options come from ``+algorithm.arl_gigpo.<name>=...`` (the keywords of `arl.algo.gigpo`), over
the verl-agent defaults in `arl.integrations.verl.gigpo.GIGPO_DEFAULTS`.

Not run on a GPU (see docs/verl.md, "When one GPU is not enough"): the CPU tests drive this
class's constructor and its advantage and metrics steps against a real TransferQueue.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from omegaconf import open_dict
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

from arl.integrations.verl.agent_loop import TURN_FIELDS, TURN_STEPS
from arl.integrations.verl.gigpo import (
    gigpo_options,
    pending_advantages,
    register_estimators,
    token_advantages,
)

TRAINER_MODE = "arl_sync"

# the extra fields GiGPO reads for a row that holds no turn (verl's batch padding)
NO_TURNS = {"arl_episode_score": 0.0, **{key: [] for key in (*TURN_FIELDS, TURN_STEPS)}}


class ArlPPOTrainerSync(PPOTrainerSync):
    """verl's sync v1 trainer; ``algorithm.adv_estimator=arl_gigpo`` gets the turns it needs."""

    def __init__(self, config: Any):
        # verl's base reads the mode in __init__ (replay buffer, its section) and keeps it as
        # self.trainer_mode for later checks: it must read "sync" everywhere (module docstring).
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        algorithm = self.config.algorithm
        if algorithm.adv_estimator != "arl_gigpo":
            return super()._compute_advantage(batch, metrics)
        if algorithm.use_kl_in_reward:
            # GiGPO reads the episodes' own rewards: a KL term in token rewards would be ignored silently
            raise ValueError("arl_gigpo takes its rewards from the episodes: set algorithm.use_kl_in_reward=False")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "response_mask", "extra_fields"])
        padded = data.to_padded_tensor()
        uids = padded.pop("uid").tolist()
        fields = padded.pop("extra_fields").tolist()
        # verl pads the batch to a multiple of its mini-batch with no-op rows that copy the first row's
        # extra_fields (`verl.trainer.ppo.padding_utils`): they hold no turn of any episode
        fields = [NO_TURNS if tag.get("is_padding") else f for f, tag in zip(fields, batch.tags, strict=True)]
        # batch keys are "{uid}_{session_id}_{output_index}": a trajectory is one (uid, session)
        trajs = [key.rsplit("_", 1)[0] for key in batch.keys]
        adv, stats = token_advantages(padded["response_mask"], fields, uids, trajs,
                                      **gigpo_options(algorithm.get("arl_gigpo", None)))
        metrics.update({f"arl_gigpo/{k}": v for k, v in stats.items()})
        metrics.update(episode_metrics([f for f, tag in zip(fields, batch.tags, strict=True) if not tag.get("is_padding")],
                                       [t for t, tag in zip(trajs, batch.tags, strict=True) if not tag.get("is_padding")]))
        with pending_advantages(adv):
            return super()._compute_advantage(batch, metrics)

    def on_step_end(self) -> None:
        # verl's sync runs here; replicas that check it (arl's CPU rollout: the weight-sync canary)
        # report through verl's own hook for sync figures, logged with this step's metrics
        super().on_step_end()
        pending = getattr(self, "_pending_sync_metrics", None) or {}
        self._pending_sync_metrics = {**pending, **replica_sync_metrics(self.llm_server_manager.get_replicas())}


def replica_sync_metrics(replicas: list[Any]) -> dict[str, float]:
    """The ``sync_metrics()`` of the replicas that have one, combined: the worst gap and time (max),
    the oldest served weight version (min); nothing for replicas without (verl's vLLM/SGLang)."""
    out: dict[str, float] = {}
    for replica in replicas:
        fn = getattr(replica, "sync_metrics", None)
        for key, value in (fn() if callable(fn) else {}).items():
            pick = min if key.endswith("_version") else max
            out[key] = pick(out[key], value) if key in out else value
    return out


def register() -> None:
    """Register the trainer mode and the estimators (idempotent)."""
    if TRAINER_REGISTRY.get(TRAINER_MODE) is not ArlPPOTrainerSync:
        register_trainer(TRAINER_MODE)(ArlPPOTrainerSync)
    register_estimators()


def episode_metrics(fields: list[dict[str, Any]], trajs: list[str]) -> dict[str, float]:
    """The step's episodes, each once however many rows it has: ``arl/episode_score`` (mean score),
    ``arl/success_rate``, ``arl/episodes``. verl's ``critic/score/mean`` averages over rows: with a
    row per turn (step mode) an episode counts once per turn, so long (mostly failed) episodes weigh more.

    >>> rows = [{"arl_episode_score": 1.0, "arl_success": True}] * 2 + [{"arl_episode_score": -0.5, "arl_success": False}]
    >>> episode_metrics(rows, ["u_0", "u_0", "u_1"])
    {'arl/episode_score': 0.25, 'arl/success_rate': 0.5, 'arl/episodes': 2.0}
    """
    episodes: dict[str, dict[str, Any]] = {}
    for f, traj in zip(fields, trajs, strict=True):
        episodes.setdefault(traj, f)
    if not episodes:
        return {}
    n = len(episodes)
    return {"arl/episode_score": sum(float(f["arl_episode_score"]) for f in episodes.values()) / n,
            "arl/success_rate": sum(bool(f["arl_success"]) for f in episodes.values()) / n,
            "arl/episodes": float(n)}
