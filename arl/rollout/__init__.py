"""Episodes -> training samples (DESIGN.md §2-§3).

`EnvManager` subclasses play episodes against an engine (`TrajEnvManager`: one sample per
episode; `StepEnvManager`: one per turn, with GiGPO state hashes); `GroupScheduler` hands out
groups of episodes sharing a seed and runs them concurrently; `rollout_metrics` summarises them.
"""

from __future__ import annotations

from arl.rollout.base import (
    EnvError,
    EnvManager,
    Episode,
    EpisodeSpec,
    ManagerConfig,
    bridge_ids,
    chat_ids,
    end_of_turn_ids,
    request_seed,
    state_hash,
)
from arl.rollout.records import EXIT_REASONS, NORMAL_EXITS, Sample, Trajectory, Turn, collate

__all__ = [
    "EXIT_REASONS",
    "NORMAL_EXITS",
    "EnvError",
    "EnvManager",
    "Episode",
    "EpisodeSpec",
    "ManagerConfig",
    "Sample",
    "Trajectory",
    "Turn",
    "bridge_ids",
    "chat_ids",
    "collate",
    "end_of_turn_ids",
    "request_seed",
    "state_hash",
]
