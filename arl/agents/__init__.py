"""Agent code that knows nothing about training (docs/architecture.md §7).

A runner plays one episode per ``await runner.run_job(seed)`` through an OpenAI-compatible async
client and returns an `EpisodeResult`. `GymRunner` and `ToolCallRunner` play arl games;
`PushModeRunner` runs any program that uses the stock `openai` client as a separate OS process;
`PullModeRunner` runs one in a sandbox without network and answers its calls over its pipes.
"""

from __future__ import annotations

from arl.agents.gym_runner import GymRunner, ToolCallRunner
from arl.agents.process import PushModeRunner
from arl.agents.pull import PullModeRunner
from arl.agents.runner import (
    GAME_STATE_KEY,
    STATE_KEY,
    STATUSES,
    AgentRunner,
    ChatClient,
    EpisodeResult,
    StepReport,
)

__all__ = ["GAME_STATE_KEY", "STATE_KEY", "STATUSES", "AgentRunner", "ChatClient", "EpisodeResult", "GymRunner",
           "PullModeRunner", "PushModeRunner", "StepReport", "ToolCallRunner"]
