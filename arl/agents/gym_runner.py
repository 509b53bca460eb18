"""GymRunner (text actions) and ToolCallRunner (function calling): agents that play arl games.

`GymRunner` sends exactly the conversation `TrajEnvManager` builds token by token (system
prompt, first user message with the instructions, then one `traj_user_message` per turn; see
`arl.envs.prompts`), so that intercepting its calls reproduces the manager's samples. Both
runners are plain agent code: messages in, messages out, no tokens. With ``observation="image"``
or ``"both"`` GymRunner shows the game's frame as the managers do, first in each prompt's last
user message, as an OpenAI ``image_url`` content part (a PNG data URL: `arl.engine.images.to_data_url`).

Failures end the episode as data, with the rewards collected so far:
- the env raises -> status "Failed", exit reason "env_error";
- the model call fails -> "max_length" (status "Finished") when the server says the context is
  full (OpenAI's error code ``context_length_exceeded``), "engine_error" for server-side
  failures (HTTP 5xx, connection errors), "agent_error" for any other refused request.
The errors are recognised by duck typing (``status_code``, ``code``): runners import no client.
"""

from __future__ import annotations

import abc
import traceback
from typing import Any

from arl.agents.runner import AgentRunner, ChatClient, EpisodeResult, StepReport
from arl.config import OBSERVATIONS
from arl.engine.images import to_data_url
from arl.envs.game import game_state_key
from arl.envs.prompts import (
    IMAGE_ONLY_TEXT,
    SYSTEM_PROMPT,
    compact_messages,
    compact_user_message,
    history_action,
    step_messages,
    traj_messages_start,
    traj_user_message,
)
from arl.envs.text import TextEnv
from arl.envs.tools import ToolEnv

# reported per step beside the state, action and validity; "final_files": the work dir's files a
# BugFix episode ended with (its last step), what `arl eval --rescore` scores again; "reward_extra":
# the numbers its reward spec reported beside the score (`arl.rollout.metrics.reward_extras`)
_INFO_KEYS = ("action_effective", "success", "final_files", "reward_extra")


class _Stop(Exception):
    """Ends the episode early with (status, exit_reason, error text)."""

    def __init__(self, status: str, exit_reason: str, error: str) -> None:
        super().__init__(error)
        self.status, self.exit_reason, self.error = status, exit_reason, error


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _model_failure(exc: Exception) -> _Stop:
    """Classify an exception raised by the model call (`_GameRunner.complete`)."""
    status = getattr(exc, "status_code", None)
    code = getattr(exc, "code", None)
    if code == "context_length_exceeded":
        return _Stop("Finished", "max_length", _describe(exc))
    if status is None or status >= 500:  # no HTTP status: connection / timeout errors
        return _Stop("Failed", "engine_error", _describe(exc))
    return _Stop("Failed", "agent_error", _describe(exc))


class _GameRunner(AgentRunner):
    """The turn loop shared by both runners; subclasses define the env and the messages."""

    def __init__(
        self,
        client: ChatClient,
        env_id: str,
        *,
        model: str = "arl",
        max_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_turns: int | None = None,
        format_penalty: float | None = None,
        extra_body: dict[str, Any] | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(client, model)
        self.env_id = env_id
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.extra_body = extra_body
        self.env_kwargs = dict(env_kwargs or {})

    # -- what subclasses define ------------------------------------------------------------------
    @abc.abstractmethod
    def make_env(self) -> Any: ...

    @abc.abstractmethod
    def first_messages(self, env: Any, observation: str, limit: int) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def assistant_message(self, message: Any) -> dict[str, Any]:
        """The reply as a history message (also what the env's step gets, see `env_action`)."""

    @abc.abstractmethod
    def env_action(self, assistant: dict[str, Any]) -> Any: ...

    @abc.abstractmethod
    def next_messages(self, turn: int, observation: Any, limit: int) -> list[dict[str, Any]]:
        """Messages after turn ``turn`` (1-based) given what the env's step returned."""

    def request_kwargs(self, env: Any) -> dict[str, Any]:
        return {}

    @property
    def fresh_prompts(self) -> bool:
        """Whether `next_messages` returns a whole new prompt instead of messages to append."""
        return False

    async def complete(self, messages: list[dict[str, Any]], extra: dict[str, Any]) -> Any:
        """One model call: the reply message (``.content``, ``.tool_calls``) to ``messages``, with the
        runner's sampling settings and ``extra`` (`request_kwargs`). A subclass may reach the model
        another way (the Responses API, a stream: benchmarks/overhead.py); what it raises ends the
        episode as a failed model call."""
        response = await self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.max_tokens,
            temperature=self.temperature, top_p=self.top_p, extra_body=self.extra_body, **extra,
        )
        return response.choices[0].message

    def record_step(self, state: str, assistant: dict[str, Any], info: dict[str, Any], reward: float) -> None:
        """Called after every env step (the state the action was taken in, the reply, the env's
        info and reward); runners that build their prompts from the history keep it here."""

    # -- the loop --------------------------------------------------------------------------------
    def _env(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise _Stop("Failed", "env_error", _describe(exc)) from exc

    async def _step(self, env: Any, action: Any) -> Any:
        """``env.step(action)``; an env with ``astep`` (whose steps run subprocesses, like the
        sandbox tool env) is awaited instead, so one episode's slow command stalls no other."""
        astep = getattr(env, "astep", None)
        if astep is None:
            return self._env(env.step, action)
        try:
            return await astep(action)
        except Exception as exc:  # noqa: BLE001 -- an env crash ends the episode as data
            raise _Stop("Failed", "env_error", _describe(exc)) from exc

    async def run_job(self, seed: int) -> EpisodeResult:
        steps: list[StepReport] = []
        metrics: dict[str, float] = {"num_turns": 0.0, "num_invalid": 0.0}
        info: dict[str, Any] = {}
        try:
            env = self._env(self.make_env)
            observation, info = self._env(env.reset, seed=seed)
            state = str(info.get("raw_obs", observation))
            info = {}
            limit = self._turn_limit(env.max_steps)
            messages = self.first_messages(env, observation, limit)
            extra = self.request_kwargs(env)
            terminated = False
            for turn in range(1, limit + 1):
                try:
                    reply = await self.complete(messages, extra)
                except Exception as exc:  # noqa: BLE001 -- a failed model call ends the episode as data
                    raise _model_failure(exc) from exc
                assistant = self.assistant_message(reply)
                messages.append(assistant)
                # GiGPO's anchor: the game's full state before the step moves it (None: no arl
                # game, and the proxy keys on the `observation` text instead, saying so per turn)
                key = self._env(game_state_key, env)
                observation, reward, terminated, truncated, info = await self._step(env, self.env_action(assistant))
                steps.append(StepReport(
                    reward=float(reward), observation=state, action=info.get("action"),
                    action_valid=None if info.get("action_valid") is None else bool(info["action_valid"]),
                    info={k: info[k] for k in _INFO_KEYS if k in info}, state_key=key))
                self.record_step(state, assistant, info, float(reward))
                state = str(info.get("raw_obs", state))
                metrics["num_turns"] += 1
                metrics["num_invalid"] += 1.0 if info.get("action_valid") is False else 0.0  # reported invalid
                if terminated or truncated or turn == limit:
                    break
                following = self.next_messages(turn, observation, limit)
                if self.fresh_prompts:
                    messages = following
                else:
                    messages.extend(following)
        except _Stop as stop:
            return EpisodeResult.from_steps(
                steps, status=stop.status, exit_reason=stop.exit_reason,
                success=bool(info.get("success", False)), metrics=metrics, error=stop.error,
            )
        return EpisodeResult.from_steps(
            steps, status="Finished", exit_reason="terminated" if terminated else "truncated",
            success=bool(info.get("success", False)), metrics=metrics,
        )

    def _turn_limit(self, env_max_steps: int | None) -> int:
        limits = [n for n in (self.max_turns, env_max_steps) if n is not None]
        if not limits:
            raise _Stop("Failed", "env_error", f"{self.env_id}: the env has no step limit; set max_turns")
        return min(limits)


class GymRunner(_GameRunner):
    """Plays a `TextEnv` with ``<answer>X</answer>`` replies.

    ``conversation="traj"`` (default) keeps one growing chat, exactly the conversation
    `TrajEnvManager` builds; ``"step"`` sends a fresh self-contained prompt per step (the last
    ``history_len`` steps and the current observation), exactly what `StepEnvManager` builds.
    ``prompt_style="compact"`` uses the grid-only prompts of `arl.envs.prompts` in either, with
    a ``system_prompt`` turn first when one is given (see `compact_messages`).
    ``observation`` is `arl.config.ManagerConfig.observation`'s: ``"image"`` / ``"both"`` put the
    game's frame (``frame()``, FrozenLake and Sokoban) first in each prompt's last user message as
    an ``image_url`` part, the text then saying `IMAGE_ONLY_TEXT` in place of the grid (``"image"``)
    or the grid too (``"both"``); the policy must be a VLM (the proxy refuses images otherwise).
    """

    def __init__(
        self, client: ChatClient, env_id: str, *, conversation: str = "traj", prompt_style: str = "full",
        history_len: int = 2, system_prompt: str | None = None, observation: str = "text", **kwargs: Any,
    ) -> None:
        super().__init__(client, env_id, **kwargs)
        if observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {OBSERVATIONS}, got {observation!r}")
        self.observation = observation
        self._game: Any = None  # the episode's game, whose frames the prompts show
        if conversation not in ("traj", "step"):
            raise ValueError(f"conversation must be 'traj' or 'step', got {conversation!r}")
        if prompt_style not in ("full", "compact"):
            raise ValueError(f"prompt_style must be 'full' or 'compact', got {prompt_style!r}")
        self.conversation = conversation
        if system_prompt is not None and prompt_style != "compact":
            raise ValueError("system_prompt applies to prompt_style 'compact' only")
        self.prompt_style = prompt_style
        self.system_prompt = system_prompt
        self.history_len = history_len
        self._history: list[tuple[str, str, float]] = []
        self._instructions = ""

    def make_env(self) -> TextEnv:
        return TextEnv(self.env_id, format_penalty=self.format_penalty, **self.env_kwargs)

    def first_messages(self, env: TextEnv, observation: str, limit: int) -> list[dict[str, Any]]:
        self._history, self._instructions, self._game = [], env.instructions, getattr(env, "unwrapped", env)
        return self._prompt(observation, 0, limit)

    def assistant_message(self, message: Any) -> dict[str, Any]:
        return {"role": "assistant", "content": message.content or ""}

    def env_action(self, assistant: dict[str, Any]) -> str:
        return assistant["content"]

    def record_step(self, state: str, assistant: dict[str, Any], info: dict[str, Any], reward: float) -> None:
        action = history_action(info.get("action"), bool(info.get("action_valid")), assistant["content"])
        self._history.append((self._shown(state), action, reward))

    def next_messages(self, turn: int, observation: str, limit: int) -> list[dict[str, Any]]:
        return self._prompt(observation, turn, limit)

    def _shown(self, observation: str) -> str:
        """The text a prompt shows for ``observation`` (`arl.rollout.base.EnvManager.shown`'s rule)."""
        return IMAGE_ONLY_TEXT if self.observation == "image" else observation

    def _prompt(self, observation: str, turn: int, limit: int) -> list[dict[str, Any]]:
        """`_messages`, the last one showing the game's frame when the prompts show images."""
        messages = self._messages(self._shown(observation), turn, limit)
        if self.observation == "text":
            return messages
        frame = self._env(self._frame)
        *head, last = messages
        return [*head, {**last, "content": [{"type": "image_url", "image_url": {"url": to_data_url(frame)}},
                                            {"type": "text", "text": last["content"]}]}]

    def _frame(self) -> Any:
        draw = getattr(self._game, "frame", None)
        if not callable(draw):
            raise TypeError(f"{type(self._game).__name__} draws no frames: observation={self.observation!r} needs a "
                            "game with frame() (FrozenLake, Sokoban)")
        return draw()

    def _messages(self, observation: str, turn: int, limit: int) -> list[dict[str, Any]]:
        """Messages after ``turn`` steps: the whole next prompt in step conversations (`run_job`
        then starts a new message list), the new user message in traj conversations."""
        compact = self.prompt_style == "compact"
        if self.conversation == "step":
            if compact:
                return compact_messages(observation, limit - turn, self.system_prompt)
            return step_messages(self._instructions, observation, turn, self._history, self.history_len,
                                 limit - turn, self.max_tokens)
        if turn == 0:
            return compact_messages(observation, limit, self.system_prompt) if compact else traj_messages_start(
                observation, limit, self.max_tokens, self._instructions)
        text = (compact_user_message(observation, limit - turn) if compact
                else traj_user_message(turn + 1, observation, limit - turn, self.max_tokens))
        return [{"role": "user", "content": text}]

    @property
    def fresh_prompts(self) -> bool:
        return self.conversation == "step"


class ToolCallRunner(_GameRunner):
    """Plays a `ToolEnv`: sends ``tools=``, gives the env the assistant message with its
    ``tool_calls``, and appends that message and the env's tool messages to the history."""

    def make_env(self) -> ToolEnv:
        return ToolEnv(self.env_id, format_penalty=self.format_penalty, **self.env_kwargs)

    def first_messages(self, env: ToolEnv, observation: str, limit: int) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{env.instructions}\n\nObservation:\n{observation}"},
        ]

    def request_kwargs(self, env: ToolEnv) -> dict[str, Any]:
        return {"tools": env.tools}

    def assistant_message(self, message: Any) -> dict[str, Any]:
        assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            assistant["tool_calls"] = [call.model_dump(exclude_none=True) for call in message.tool_calls]
        return assistant

    def env_action(self, assistant: dict[str, Any]) -> dict[str, Any]:
        return assistant

    def next_messages(self, turn: int, observation: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
        return list(observation)  # ToolEnv.step returns the reply messages in place of an observation
