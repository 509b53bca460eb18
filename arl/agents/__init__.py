"""Agent code that knows nothing about training (docs/architecture.md §7).

A runner plays one episode per ``await runner.run_job(seed)`` through an OpenAI-compatible async
client and returns an `EpisodeResult`. `GymRunner` and `ToolCallRunner` play arl games;
`PushModeRunner` runs any program that uses the stock `openai` client as a separate OS process;
`PullModeRunner` runs one in a sandbox without network and answers its calls over its pipes.
"""

from __future__ import annotations

from arl._renamed import old_names
from arl.agents.gym_runner import GymRunner, ToolCallRunner
from arl.agents.process import PushModeRunner
from arl.agents.pull import PullModeRunner
from arl.agents.runner import (
    OBSERVATION_INFO_KEY,
    STATE_KEY_INFO_KEY,
    STATUSES,
    AgentRunner,
    ChatClient,
    EpisodeResult,
    StepReport,
)

__all__ = ["OBSERVATION_INFO_KEY", "STATE_KEY_INFO_KEY", "STATUSES", "AgentRunner", "ChatClient", "EpisodeResult",
           "GymRunner", "PullModeRunner", "PushModeRunner", "StepReport", "ToolCallRunner"]

# STATE_KEY and GAME_STATE_KEY, the old names of OBSERVATION_INFO_KEY and STATE_KEY_INFO_KEY
__getattr__ = old_names(__name__, globals(), STATE_KEY="OBSERVATION_INFO_KEY", GAME_STATE_KEY="STATE_KEY_INFO_KEY")
