"""Prompt texts around a game observation (docs/reference.md §1.4).

Shared by the env managers (which build token prompts) and by agent runners (which send the same
messages through an OpenAI-compatible client), so both produce identical conversations.
"""

from __future__ import annotations

from collections.abc import Sequence

# What an observation's text says with observation: image (the grid is in the frame only): the
# managers' prompts and GymRunner's (arl.agents.gym_runner) alike
IMAGE_ONLY_TEXT = "(the board is the image above)"

SYSTEM_PROMPT = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high reward in "
    "the game."
)

FORMAT_RULE = "output format is '<answer> [your answer] </answer>' with no extra text."


def format_reminder(actions_left: int, max_tokens: int) -> str:
    """The closing lines of every anchor prompt: the answer format, actions left, length limit."""
    return (
        f"Strictly follow this format: 1. {FORMAT_RULE} 2. You have {actions_left} actions left. "
        f"3. Max response length: {max_tokens} words (tokens).\nDecide the next action:"
    )


def traj_user_message(
    turn: int, observation: str, actions_left: int, max_tokens: int, instructions: str | None = None
) -> str:
    """User message of turn `turn` (1-based) in trajectory mode; the first carries the instructions."""
    text = f"Turn {turn}:\nObservation:\n{observation}\n{format_reminder(actions_left, max_tokens)}"
    return f"{instructions}\n\n{text}" if instructions else text


def traj_messages_start(
    observation: str, actions_left: int, max_tokens: int, instructions: str
) -> list[dict[str, str]]:
    """The first two messages of a trajectory-mode conversation."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": traj_user_message(1, observation, actions_left, max_tokens, instructions)},
    ]


HISTORY_ACTION_CHARS = 200  # an invalid reply is shown in the step history, clipped


def history_action(action: str | None, valid: bool, reply: str) -> str:
    """What a step prompt's history shows as a step's action: the canonical action name when the
    reply parsed, else the reply itself (stripped, clipped), so the model sees its own mistake.

    >>> history_action("Up", True, "<answer>up</answer>"), history_action(None, False, "  jump ")
    ('Up', 'jump')
    """
    if valid and action is not None:
        return action
    return reply.strip()[:HISTORY_ACTION_CHARS] or "(empty reply)"


def step_user_message(
    instructions: str,
    observation: str,
    step: int,
    history: Sequence[tuple[str, str, float]],
    history_len: int,
    actions_left: int,
    max_tokens: int,
) -> str:
    """Self-contained prompt of step mode (ROLL GiGPO / verl-agent).

    `history` holds every earlier step as (observation, action text, reward), valid or not (ROLL's
    step manager lists only invalid steps, a regression we do not copy); the last `history_len`
    entries are shown.
    """
    parts = [instructions, ""]
    recent = list(history)[-history_len:] if history_len > 0 else []
    if step > 0:
        parts.append(
            f"Prior to this step, you have completed {step} steps. Recent history: the last "
            f"{len(recent)} (observation, action, reward) entries:"
        )
        first = step - len(recent)
        for i, (obs, action, reward) in enumerate(recent):
            parts.append(f"Step {first + i + 1}:\nObservation:\n{obs}\nAction: {action}\nReward: {reward:g}")
        parts.append("")
    parts.append(f"Your current observation is:\n{observation}")
    parts.append(format_reminder(actions_left, max_tokens))
    return "\n".join(parts)


def step_messages(
    instructions: str,
    observation: str,
    step: int,
    history: Sequence[tuple[str, str, float]],
    history_len: int,
    actions_left: int,
    max_tokens: int,
) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": step_user_message(
                instructions, observation, step, history, history_len, actions_left, max_tokens
            ),
        },
    ]


# -- compact style --------------------------------------------------------------------------------
# For models that cannot read English (the tiny random-init model): no system prompt, no
# instructions, no format rule, only the grid and the turns left. Prompts shrink ~7x, and with
# them a CPU training step. The answer format is still `<answer>X</answer>` (taught by the warm-start).


def compact_user_message(observation: str, actions_left: int) -> str:
    return f"Observation:\n{observation}\nActions left: {actions_left}\nAnswer:"


def compact_messages(observation: str, actions_left: int, system: str | None = None) -> list[dict[str, str]]:
    """The compact prompt; with ``system`` (even "") a system turn first. Without one, a chat
    template may inject its own default: SmolLM2's adds "You are a helpful AI assistant named
    SmolLM, trained by Hugging Face" (20 of a compact prompt's 56 tokens); ``system=""`` renders
    an empty system turn instead (5 tokens)."""
    user = {"role": "user", "content": compact_user_message(observation, actions_left)}
    return [user] if system is None else [{"role": "system", "content": system}, user]
