"""ToolEnv: an arl game behind an OpenAI function-calling interface (docs/architecture.md §6).

The model gets one tool, ``move(direction)``. Each assistant message is one turn.

Policy (mirrors TextEnv's "exactly one answer per turn"): a turn is valid only when the message
carries exactly one tool call, to ``move``, whose ``arguments`` is a JSON object with a single
``direction`` string naming an action (case-insensitive). Anything else - no tool calls, several
calls, unknown tool, bad JSON, missing / extra / mistyped argument, a message that is not a dict -
is an invalid turn: a no-op step (it counts against the step limit) plus ``format_penalty``, and
the error text goes back to the model. Never an exception: arbitrary model output is data.

Replies: one ``{"role": "tool", "tool_call_id": id, "content": ...}`` per call that has a string
id; when the message has no call that can be answered by id (no calls, or calls without ids),
one ``{"role": "user", "content": ...}`` message carries the error and the observation instead.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

import gymnasium as gym

from arl.envs.text import TextEnv
from arl.sandbox.hostfs import encodable

TOOL_NAME = "move"


def _parse_call(call: Any, action_names: list[str]) -> tuple[str | None, str | None]:
    """(canonical action, None) for a well-formed move call, else (None, error text)."""
    if not isinstance(call, dict):
        return None, "each tool call must be an object"
    if call.get("type", "function") != "function":
        return None, "tool call type must be 'function'"
    function = call.get("function")
    if not isinstance(function, dict):
        return None, "tool call has no 'function' object"
    name = function.get("name")
    if name != TOOL_NAME:
        return None, f"unknown tool {reprlib.repr(name)}; the only tool is {TOOL_NAME!r}"
    arguments = function.get("arguments", "")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None, "arguments are not valid JSON"
    if not isinstance(arguments, dict):
        return None, 'arguments must be a JSON object like {"direction": "Up"}'
    if "direction" not in arguments:
        return None, "missing required argument 'direction'"
    extra = [reprlib.repr(k) for k in arguments if k != "direction"]
    if extra:
        return None, f"unexpected argument(s): {', '.join(extra)}"
    direction = arguments["direction"]
    if not isinstance(direction, str):
        return None, "'direction' must be a string"
    wanted = direction.strip().lower()
    for action in action_names:
        if action.lower() == wanted:
            return action, None
    return None, f"unknown direction {reprlib.repr(direction)}; use one of {', '.join(action_names)}"


class ToolEnv:
    """Function-calling turns around an arl game; wraps a `TextEnv` for the game mechanics.

    ``ToolEnv("arl/Sokoban-v0")``, ``ToolEnv(game_instance)`` or ``ToolEnv(text_env)``.
    ``step(assistant_message) -> (messages, reward, terminated, truncated, info)``; info has
    TextEnv's keys plus ``error`` (str or None) and ``num_tool_calls``.
    """

    def __init__(
        self, env: gym.Env | str | TextEnv, *, format_penalty: float | None = None, **make_kwargs: Any
    ) -> None:
        if isinstance(env, TextEnv):
            if make_kwargs or format_penalty is not None:
                raise TypeError("pass format_penalty / make kwargs to the TextEnv, not to ToolEnv")
            self.text_env = env
        else:
            self.text_env = TextEnv(env, format_penalty=format_penalty, **make_kwargs)
        self.action_names: list[str] = list(self.text_env.action_names)
        self.game_name: str = self.text_env.game_name
        self.max_steps: int | None = self.text_env.max_steps
        self.format_penalty: float = self.text_env.format_penalty
        self.tools: list[dict[str, Any]] = [
            {
                "type": "function",
                "function": {
                    "name": TOOL_NAME,
                    "description": "Move the player one cell in a direction (one move per turn).",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "direction": {
                                "type": "string",
                                "enum": list(self.action_names),
                                "description": "Direction to move.",
                            }
                        },
                        "required": ["direction"],
                        "additionalProperties": False,
                    },
                },
            }
        ]

    @property
    def unwrapped(self) -> gym.Env:
        return self.text_env.unwrapped

    @property
    def instructions(self) -> str:
        game = self.unwrapped
        return (
            f"{game.description}\n"
            f"The meaning of each symbol in the state is:\n{game.symbol_legend()}\n"
            f"Your available actions are:\n{', '.join(self.action_names)}\n"
            f"Act by calling the `{TOOL_NAME}` tool with one direction, exactly one call per turn. "
            "Any other reply is an invalid action."
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        return self.text_env.reset(seed=seed, options=options)

    def close(self) -> None:
        self.text_env.close()

    def step(self, assistant_message: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        action, error, calls = self._parse_message(assistant_message)
        text, reward, terminated, truncated, info = self.text_env.step_action(action)
        info = {**info, "error": error, "num_tool_calls": len(calls)}
        status = self._status(reward, terminated, truncated, info)
        body = (
            f"{text}\n{status}" if error is None else f"Error: {error}. No move was made.\n{text}\n{status}"
        )
        messages: list[dict[str, Any]] = []
        unanswered = not calls
        for call in calls:
            call_id = call.get("id") if isinstance(call, dict) else None
            if isinstance(call_id, str):  # echoed back: made encodable like every reply text
                messages.append({"role": "tool", "tool_call_id": encodable(call_id), "content": encodable(body)})
            else:
                unanswered = True
        if unanswered:
            messages.append({"role": "user", "content": encodable(body)})
        return messages, reward, terminated, truncated, info

    def _parse_message(self, message: Any) -> tuple[str | None, str | None, list[Any]]:
        """(action or None, error or None, the raw tool-call list as far as it is a list)."""
        if not isinstance(message, dict):
            return None, "the assistant message must be an object", []
        calls = message.get("tool_calls")
        if not calls:
            return None, f"no tool call; call the `{TOOL_NAME}` tool with a direction", []
        if not isinstance(calls, list):
            return None, "tool_calls must be a list", []
        if len(calls) != 1:
            return None, f"call exactly one tool per turn (this message has {len(calls)} calls)", calls
        action, error = _parse_call(calls[0], self.action_names)
        return action, error, calls

    def _status(self, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> str:
        status = f"Reward: {reward:+.2f}."
        if self.max_steps is not None:
            status += f" Steps used: {info['elapsed_steps']}/{self.max_steps}."
        if info.get("success"):
            status += " Success! The episode is over."
        elif terminated or truncated:
            status += " The episode is over."
        return status
