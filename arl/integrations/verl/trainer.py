"""``trainer.v1.trainer_mode=arl_sync``: verl's synchronous v1 trainer, GiGPO computed by arl.

The only change to `PPOTrainerSync` is its ``_compute_advantage`` step for
``algorithm.adv_estimator=arl_gigpo``: read each row's ``extra_fields`` (the turns `ArlAgentLoop`
recorded) with the response mask and uid from TransferQueue, compute token advantages with
`arl.integrations.verl.gigpo.token_advantages`, write ``advantages`` / ``returns`` back the way
the base method does. Every other estimator runs verl's own code. Options come from
``+algorithm.arl_gigpo.<name>=...`` (gamma, step_weight, mode, invalid_penalty, episode_stats,
singleton: the keywords of `arl.algo.gigpo`).

Not run in arl's CI: this path needs verl's TransferQueue controller and a GPU trainer (see the
README section "When one GPU is not enough"); the advantage math it calls is tested on CPU.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
from verl.workers.utils.padding import response_to_nested

from arl.integrations.verl.gigpo import register_estimators, token_advantages

TRAINER_MODE = "arl_sync"


class ArlPPOTrainerSync(PPOTrainerSync):
    """verl's sync v1 trainer with arl's GiGPO as ``algorithm.adv_estimator=arl_gigpo``."""

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        algorithm = self.config.algorithm
        if algorithm.adv_estimator != "arl_gigpo":
            return super()._compute_advantage(batch, metrics)
        if algorithm.use_kl_in_reward:
            raise ValueError("arl_gigpo takes its rewards from the episodes: set algorithm.use_kl_in_reward=False")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "response_mask", "extra_fields"])
        response_mask = data["response_mask"]
        padded = data.to_padded_tensor()
        uids = padded.pop("uid").tolist()
        fields = padded.pop("extra_fields").tolist()
        # batch keys are "{uid}_{session_id}_{output_index}": a trajectory is one (uid, session)
        trajs = [key.rsplit("_", 1)[0] for key in batch.keys]
        options = dict(algorithm.get("arl_gigpo", None) or {})
        adv, stats = token_advantages(padded["response_mask"], fields, uids, trajs, **options)
        metrics.update({f"arl_gigpo/{k}": v for k, v in stats.items()})
        nested = response_to_nested(adv, response_mask)
        output = TensorDict({"advantages": nested, "returns": nested}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)


def register() -> None:
    """Register the trainer mode and the estimators (idempotent)."""
    if TRAINER_REGISTRY.get(TRAINER_MODE) is not ArlPPOTrainerSync:
        register_trainer(TRAINER_MODE)(ArlPPOTrainerSync)
    register_estimators()
