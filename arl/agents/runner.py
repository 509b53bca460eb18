"""Agent runners: agent code that plays one episode through an OpenAI-compatible client.

A runner knows nothing of tokens, engines or training (DESIGN.md §6). It gets a client with the
`openai.AsyncOpenAI` shape (anything with ``await client.chat.completions.create(...)``) and a
model name, plays one episode and reports an `EpisodeResult`. The same runner runs unchanged
against arl's in-process client, arl's HTTP proxy, or any real OpenAI-compatible server.
"""

from __future__ import annotations

import abc
from typing import Any, Literal, Protocol

import attrs

RunnerStatus = Literal["Finished", "Failed", "NoData", "Timeout"]
STATUSES: tuple[str, ...] = ("Finished", "Failed", "NoData", "Timeout")


class ChatClient(Protocol):
    """The part of `openai.AsyncOpenAI` a runner uses: ``client.chat.completions.create``."""

    chat: Any


@attrs.define
class EpisodeResult:
    """What a runner reports about its episode (the env's view; no tokens).

    ``score`` is the episode return (sum of rewards); ``step_scores`` the reward of each env step,
    in the order of the model calls that drove them. ``exit_reason`` uses the rollout vocabulary
    (`arl.rollout.records.EXIT_REASONS`): "terminated", "truncated", "env_error", "agent_error",
    "timeout", "no_data", ...
    """

    status: RunnerStatus = attrs.field(default="Finished", validator=attrs.validators.in_(STATUSES))
    score: float = 0.0
    step_scores: list[float] = attrs.Factory(list)
    exit_reason: str = "terminated"
    success: bool = False
    metrics: dict[str, float] = attrs.Factory(dict)
    error: str | None = None  # exception text for abnormal exits
    # Optional per-step env facts, aligned with step_scores (keys: action, action_valid,
    # action_effective, success); managers copy them onto their Turns for the rollout metrics.
    step_infos: list[dict[str, Any]] = attrs.Factory(list)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> EpisodeResult:
        """Parse a result written by an out-of-process agent; unknown keys are ignored.

        Raises ValueError/TypeError on a malformed document (the caller turns that into data).
        """
        if not isinstance(data, dict):
            raise TypeError(f"episode result must be a JSON object, got {type(data).__name__}")
        fields = {f.name for f in attrs.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        result = cls(**kwargs)
        result.score = float(result.score)
        result.step_scores = [float(s) for s in result.step_scores]
        result.success = bool(result.success)
        result.metrics = {str(k): float(v) for k, v in dict(result.metrics).items()}
        result.step_infos = [dict(i) for i in result.step_infos]
        if result.error is not None:
            result.error = str(result.error)
        return result


class AgentRunner(abc.ABC):
    """Plays one episode per `run_job(seed)` through ``client`` (OpenAI-compatible, async)."""

    def __init__(self, client: ChatClient, model: str = "arl") -> None:
        self.client = client
        self.model = model

    @abc.abstractmethod
    async def run_job(self, seed: int) -> EpisodeResult:
        """Play the episode of ``seed``; report failures as data where the runner can."""
