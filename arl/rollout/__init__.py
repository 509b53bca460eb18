"""Episodes -> training samples (docs/architecture.md §3).

`EnvManager` subclasses play episodes against an engine (`TrajEnvManager`: one sample per
episode; `StepEnvManager`: one per turn, with GiGPO state hashes; `ForkEnvManager`: the step
manager plus anchor groups made by forking chosen states); `GroupScheduler` hands out
groups of episodes sharing a seed and runs them concurrently; `rollout_metrics` summarises them.
"""

from __future__ import annotations

from arl._renamed import old_names
from arl.engine.prompt import PromptView
from arl.envs.game import state_hash
from arl.rollout.base import (
    EnvError,
    EnvManager,
    Episode,
    EpisodeSpec,
    InternalError,
    bridge_ids,
    chat_ids,
    end_of_turn_ids,
    request_seed,
)
from arl.rollout.fork import ForkEnvManager, NotForkableError
from arl.rollout.metrics import rollout_metrics
from arl.rollout.proxy import ProxyEnvManager
from arl.rollout.records import (
    EXIT_REASONS,
    NORMAL_EXITS,
    ForkBranch,
    Sample,
    Trajectory,
    Turn,
    TurnSpan,
    collate,
)
from arl.rollout.scheduler import VAL_BASE_SEED, GroupScheduler, RolloutBatch
from arl.rollout.step import StepEnvManager
from arl.rollout.traj import TrajEnvManager

__all__ = [
    "EXIT_REASONS",
    "NORMAL_EXITS",
    "VAL_BASE_SEED",
    "EnvError",
    "EnvManager",
    "Episode",
    "EpisodeSpec",
    "ForkBranch",
    "ForkEnvManager",
    "GroupScheduler",
    "InternalError",
    "NotForkableError",
    "ProxyEnvManager",
    "PromptView",
    "RolloutBatch",
    "Sample",
    "StepEnvManager",
    "TrajEnvManager",
    "Trajectory",
    "Turn",
    "TurnSpan",
    "bridge_ids",
    "chat_ids",
    "collate",
    "end_of_turn_ids",
    "request_seed",
    "rollout_metrics",
    "state_hash",
]


# Branch, the old name of ForkBranch; ManagerConfig, which moved to arl.config with every config record
# (docs/architecture.md §10)
__getattr__ = old_names(__name__, globals(), Branch="ForkBranch", ManagerConfig="arl.config:ManagerConfig")
