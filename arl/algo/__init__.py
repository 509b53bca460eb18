"""RL algorithms: advantage estimators and the policy loss. Imports nothing of arl but itself.

`advantages` is numpy-only (per-sample scalars); `loss` is torch (per-token terms).
"""

from arl.algo.advantages import (
    discounted_returns,
    episode_advantages,
    fork_returns,
    gigpo,
    gigpo_forked,
    grpo,
    reinforce,
    step_advantages,
)
from arl.algo.loss import (
    entropy_from_logits,
    loss_normalizers,
    policy_loss,
    predicting_positions,
    token_logprobs,
)

__all__ = [
    "discounted_returns",
    "entropy_from_logits",
    "episode_advantages",
    "fork_returns",
    "gigpo",
    "gigpo_forked",
    "grpo",
    "loss_normalizers",
    "policy_loss",
    "predicting_positions",
    "reinforce",
    "step_advantages",
    "token_logprobs",
]
