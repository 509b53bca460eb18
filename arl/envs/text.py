"""TextEnv: an arl game behind a text interface for LLM agents (docs/architecture.md §6, docs/reference.md §1.3).

The observation is the grid text; the action is the model's raw reply, parsed as
``<answer>Action</answer>`` (optionally preceded by ``<think>...</think>``). An unparseable reply
is a no-op turn that still counts against the step limit, plus ``format_penalty``
(default: the game's ROLL trajectory-mode value, Sokoban -0.15, FrozenLake -0.01).

The no-op is sent down the wrapper stack as ``step(None)``: the games treat ``None`` as a no-op,
and passing it through gymnasium's TimeLimit is what makes the wasted turn count.
"""

from __future__ import annotations

import asyncio
import collections
import re
import string
import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

from arl.envs.game import check_game
from arl.envs.latency import StepLatency

# The think block may hold anything except its own closing tag (so text after a first
# </think> cannot hide inside it); the answer holds one word, surrounded by optional whitespace.
_ANSWER_RE = re.compile(
    r"(?:<think>(?:(?!</think>).)*</think>\s*)?<answer>\s*([^<>\s]+)\s*</answer>",
    re.IGNORECASE | re.DOTALL,
)
_ANSWER_TAG_RE = re.compile(r"<answer>", re.IGNORECASE)
_MAX_ACTION_CHARS = 1 << 16  # Text action space bound; longer replies are still parsed (and fail)


def parse_answer(text: Any, action_names: list[str]) -> str | None:
    """The canonical action name in ``text``, or None when the reply is not exactly one answer.

    Accepted: optional ``<think>...</think>``, then ``<answer> name </answer>``, nothing else
    outside the tags (surrounding whitespace is stripped). Case-insensitive for tags and name.
    """
    if not isinstance(text, str):
        return None
    text = text.strip()
    match = _ANSWER_RE.fullmatch(text)
    if match is None or len(_ANSWER_TAG_RE.findall(text)) != 1:  # two answers are one too many
        return None
    word = match.group(1).lower()
    for name in action_names:
        if name.lower() == word:
            return name
    return None


def positions_line(rows: list[str], symbols: str | None = None) -> str:
    """Where each of ``symbols`` (default: all but the most common) is in the grid ``rows``, 1-based.

    >>> positions_line(["O G _ _".replace(" ", ""), "_ _ _ P".replace(" ", "")], "OGP")
    'O: row 1 col 1. G: row 1 col 2. P: row 2 col 4.'
    >>> positions_line(["#_#", "#P#"])          # '#' is the most common: every other symbol
    '_: row 1 col 2. P: row 2 col 2.'
    """
    if symbols is None:
        counts = collections.Counter("".join(rows))
        floor = counts.most_common(1)[0][0] if counts else ""
        symbols = "".join(dict.fromkeys(c for c in "".join(rows) if c != floor))
    found: dict[str, list[str]] = {}
    for r, row in enumerate(rows, 1):
        for c, ch in enumerate(row, 1):
            if ch in symbols:
                found.setdefault(ch, []).append(f"row {r} col {c}")
    order = [s for s in symbols if s in found]
    return " ".join(f"{s}: {', '.join(found[s])}." for s in order)


def surroundings_line(rows: list[str], player: str, moves: dict[str, tuple[int, int]],
                      names: dict[str, str], goal: str = "") -> str:
    """What lies one move away in each direction, and how far the ``goal`` symbol is, in action names.

    ``moves`` maps each action name to its (d_row, d_col); ``names`` maps a symbol to its word; a
    move off the grid reads "edge". The goal's offset is spelled with the same action names (the
    moves whose delta is one unit along an axis). Empty when no ``player`` symbol is on the grid.

    >>> moves = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
    >>> names = {"_": "frozen", "O": "hole", "G": "goal", "P": "player"}
    >>> surroundings_line(["P_", "OG"], "P", moves, names, goal="G")
    'Left: edge. Down: hole. Right: frozen. Up: edge. Goal: Down 1, Right 1.'
    >>> surroundings_line(["_G", "_P"], "P", moves, names, goal="G")
    'Left: frozen. Down: edge. Right: edge. Up: goal. Goal: Up 1.'
    """
    at = next(((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in player), None)
    if at is None:
        return ""
    parts = []
    for action, (dr, dc) in moves.items():
        r, c = at[0] + dr, at[1] + dc
        inside = 0 <= r < len(rows) and 0 <= c < len(rows[r])
        parts.append(f"{action}: {names.get(rows[r][c], rows[r][c]) if inside else 'edge'}.")
    target = next(((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in goal), None)
    if goal and target is not None:
        unit = {delta: action for action, delta in moves.items()}  # (1, 0) -> "Down", ...
        dr, dc = target[0] - at[0], target[1] - at[1]
        steps = [(unit.get(delta), n) for delta, n in
                 (((1 if dr > 0 else -1, 0), abs(dr)), ((0, 1 if dc > 0 else -1), abs(dc))) if n]
        if steps and all(action is not None for action, _ in steps):
            parts.append("Goal: " + ", ".join(f"{action} {n}" for action, n in steps) + ".")
    return " ".join(parts)


def find_time_limit(env: gym.Env) -> int | None:
    """max_episode_steps of the first TimeLimit in the wrapper stack (None when there is none)."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, TimeLimit):
            return int(env._max_episode_steps)
        env = env.env
    return None


def make_game(env: gym.Env | str, **make_kwargs: Any) -> gym.Env:
    """An env instance as given, or ``gymnasium.make(id, **make_kwargs)`` for an id string."""
    if isinstance(env, str):
        from arl.envs import register_envs  # late import: arl.envs imports this module

        register_envs()
        return gym.make(env, **make_kwargs)
    if make_kwargs:
        raise TypeError("keyword arguments are only accepted with an env id string")
    return env


def game_action_names(env: gym.Env | str) -> list[str]:
    """The action names an arl game answers in (``<answer>{name}</answer>``), for an id or an env.

    What a scripted teacher must say so that its answers are valid: a game may name its actions
    anything (``West/South/East/North``, ``Push/Wait``), so nothing may assume directions. A gym
    env without ``action_names`` is not an arl game and gets a TypeError saying so.

    >>> game_action_names("arl/FrozenLake-v0")
    ['Left', 'Down', 'Right', 'Up']
    """
    game = make_game(env)
    try:
        names = getattr(game.unwrapped, "action_names", None)
    finally:
        if isinstance(env, str):  # we made it, we close it
            game.close()
    if not names:
        raise TypeError(f"{type(game.unwrapped).__name__} has no action_names: it is not an arl game")
    return list(names)


class TextEnv(gym.Wrapper):
    """Text in, text out around an arl game (`SokobanEnv`, `FrozenLakeEnv`).

    ``TextEnv("arl/Sokoban-v0", format_penalty=-0.1)`` or ``TextEnv(env_instance)``.
    Info per step: ``action_valid``, ``action_effective``, ``success``, ``action`` (canonical
    name or None), ``raw_obs`` (grid text of the new state), ``format_penalty`` (what was added),
    ``elapsed_steps``, plus the game's own keys.

    ``cell_separator`` goes between the cells of a row in the text (not in the game's state key):
    ``" "`` renders ``P _ _ O`` instead of ``P__O``, which a BPE tokenizer cuts into one token per
    cell (SmolLM2's merges ``__`` and ``___`` into single tokens, so a token's column is not its position).

    ``positions=True`` adds one line under the grid that names where things are, rows and columns
    counted from 1 at the top left: ``P: row 4 col 4. G: row 1 col 2. O: row 1 col 1, row 2 col 3.``
    for the game's ``position_symbols`` (FrozenLake: everything but frozen floor; Sokoban: player,
    boxes, targets), or, for a game that names none, every symbol but the grid's most common one.
    It is a function of the grid, so the state key and GiGPO's anchors do not change; it is for
    a small pretrained model that reads words and digits better than a 2-D layout of characters.

    ``surroundings=True`` adds a line saying what lies one move away under each action name and,
    for a game with a ``goal_symbol``, the goal's offset in the same names:
    ``Left: edge. Down: hole. Right: frozen. Up: edge. Goal: Down 2, Right 1.`` The game must
    declare ``action_deltas`` (one (d_row, d_col) per action), ``player_symbols`` and
    ``symbol_names``. Also a function of the grid: the state key does not change. It turns reading
    the grid into reading words next to the action names, which SmolLM2-135M can learn and the
    2-D grid alone it did not (benchmarks/HISTORY.md, "SmolLM2-135M on FrozenLake").

    ``step_latency`` (off by default): a heavy-tailed wait after every step,
    ``{alpha, scale_s, cap_s, per}`` (`arl.envs.latency.StepLatency`; a config's
    ``rollout.manager.env_kwargs.step_latency``), for a game that behaves like a slow tool
    environment (a long-tailed workload: ``rollout.partial``, ``rollout.spare_groups``). `step`
    sleeps through it (a slow env blocks its caller); `astep`, which arl's managers await, waits
    without blocking the event loop. ``reset(options={"episode": name})`` names the episode the
    wait is drawn for (the managers pass its ``traj_id``); ``info["latency_s"]`` is the wait.
    """

    def __init__(
        self, env: gym.Env | str, *, format_penalty: float | None = None, cell_separator: str = "",
        positions: bool = False, surroundings: bool = False,
        step_latency: StepLatency | Mapping[str, Any] | None = None, **make_kwargs: Any,
    ) -> None:
        if "\n" in cell_separator:
            raise ValueError(f"cell_separator must not contain a newline (rows are lines), got {cell_separator!r}")
        self.step_latency = StepLatency.from_config(step_latency)  # before the game: a bad option makes none
        self._episode: tuple[int | None, str | None] = (None, None)  # (seed, name) that step_latency draws for
        super().__init__(make_game(env, **make_kwargs))
        game = self.env.unwrapped
        check_game(game)
        self.action_names: list[str] = list(game.action_names)
        self.game_name: str = game.game_name
        self.max_steps: int | None = find_time_limit(self.env)
        self.format_penalty = float(game.default_format_penalty if format_penalty is None else format_penalty)
        self.cell_separator = str(cell_separator)
        self.positions = bool(positions)
        self.surroundings = bool(surroundings)
        if self.surroundings:
            for attr in ("action_deltas", "player_symbols"):
                if not hasattr(game, attr):
                    raise TypeError(f"surroundings=True needs the game's {attr!r}; {type(game).__name__} has none")
            self._moves = dict(zip(self.action_names, (tuple(d) for d in game.action_deltas), strict=True))
        h, w = game.observation_space.shape
        grid_chars = h * (w + 1 + (w - 1) * len(self.cell_separator))
        charset = frozenset(game.symbols + "\n" + self.cell_separator)
        if self.positions:  # "S: row R col C, " per cell at most, plus a ". " per symbol
            charset |= frozenset(string.ascii_letters + string.digits + ":,. ")
            grid_chars += 1 + h * w * (len("X: row 99 col 99, ")) + 2 * len(game.symbols)
        if self.surroundings:  # "Name: word. " per action, "Goal: Name 99, Name 99."
            names = game.symbol_names
            charset |= frozenset(string.ascii_letters + string.digits + ":,. " + "".join(self.action_names)
                                 + "".join(names.values()))
            word = max(len(w) for w in [*names.values(), "edge"])
            grid_chars += 1 + sum(len(a) + word + 4 for a in self.action_names) + 6 + 2 * (
                max(len(a) for a in self.action_names) + 5)
        self.observation_space = spaces.Text(max_length=grid_chars, min_length=1, charset=charset)
        self.action_space = spaces.Text(
            max_length=_MAX_ACTION_CHARS, min_length=0, charset=frozenset(string.printable)
        )
        self.elapsed_steps = 0

    # ------------------------------------------------------------------ text
    @property
    def instructions(self) -> str:
        """Game description, symbol legend, available actions and the answer format."""
        game = self.env.unwrapped
        return (
            f"{game.description}\n"
            f"The meaning of each symbol in the state is:\n{game.symbol_legend()}\n"
            f"Your available actions are:\n{', '.join(self.action_names)}\n"
            "Answer with exactly one action per turn in the format <answer>Action</answer>, "
            f"for example <answer>{self.action_names[0]}</answer>; you may reason first inside "
            "<think>...</think>. Any other reply is an invalid action."
        )

    def parse_action(self, text: Any) -> str | None:
        return parse_answer(text, self.action_names)

    @property
    def actions_left(self) -> int | None:
        return None if self.max_steps is None else max(0, self.max_steps - self.elapsed_steps)

    def grid_text(self) -> str:
        text = self.env.unwrapped.grid_text()  # one character per cell, rows joined by "\n"
        rows = text.split("\n")
        out = "\n".join(self.cell_separator.join(row) for row in rows) if self.cell_separator else text
        if self.positions:
            out += "\n" + positions_line(rows, getattr(self.env.unwrapped, "position_symbols", None))
        if self.surroundings:
            game = self.env.unwrapped
            out += "\n" + surroundings_line(rows, game.player_symbols, self._moves, game.symbol_names,
                                           getattr(game, "goal_symbol", ""))
        return out

    # ------------------------------------------------------------------ gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The game reset to ``seed``; ``options["episode"]`` (taken out, the game never sees it)
        names the episode for ``step_latency``."""
        options = dict(options or {})
        episode = options.pop("episode", None)
        _obs, info = self.env.reset(seed=seed, options=options or None)
        self._episode = (seed, None if episode is None else str(episode))
        self.elapsed_steps = 0
        text = self.grid_text()
        return text, {**info, "raw_obs": text, "elapsed_steps": 0}

    def step(self, action_text: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One turn with the model's reply; with ``step_latency``, blocks for its wait after it."""
        out = self.step_action(self.parse_action(action_text))
        if out[4].get("latency_s"):
            time.sleep(out[4]["latency_s"])
        return out

    async def astep(self, action_text: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`step` for an event loop: the ``step_latency`` wait is awaited, not slept."""
        out = self.step_action(self.parse_action(action_text))
        if out[4].get("latency_s"):  # no latency, no await: the loop's order of episodes is step()'s
            await asyncio.sleep(out[4]["latency_s"])
        return out

    def step_action(self, action: str | None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One turn with an already-parsed canonical action name; None is an invalid turn."""
        valid = action in self.action_names
        index = self.action_names.index(action) if valid else None
        _obs, reward, terminated, truncated, info = self.env.step(index)
        self.elapsed_steps += 1
        penalty = 0.0 if valid else self.format_penalty
        text = self.grid_text()
        info = {
            **info,
            "action_valid": valid,
            "action_effective": bool(info.get("action_effective", False)),
            "success": bool(info.get("success", False)),
            "action": action if valid else None,
            "raw_obs": text,
            "format_penalty": penalty,
            "elapsed_steps": self.elapsed_steps,
        }
        if self.step_latency is not None:
            seed, episode = self._episode
            info["latency_s"] = self.step_latency.wait_s(seed=seed, episode=episode, t=self.elapsed_steps - 1)
        return text, float(reward) + penalty, bool(terminated), bool(truncated), info
