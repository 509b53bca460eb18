"""Game: what a grid text game gives arl (the contract `TextEnv`, the warm-start and the tokenizer read).

A game is a gymnasium env over a grid of symbols. To be trained on, it subclasses `Game` and
provides, as class or instance attributes:

- ``action_names``: what the model answers (``<answer>{name}</answer>``), in the order of the
  env's ``Discrete`` actions. Any words: ``West/South/East/North`` or ``Push/Wait``; nothing in
  arl assumes directions (the warm-start's teacher answers these names).
- ``game_name``, ``description`` (the rules in prose, shown in the instructions) and
  ``default_format_penalty`` (the reward added for an unparseable reply).
- ``symbols``: every character ``grid_text()`` may contain, and ``symbol_names``: a word for each
  (``{"_": "frozen", "O": "hole"}``), from which the legend is written.
- ``grid_text()``: the state as text, one symbol per cell, rows joined by ``"\\n"``;
  ``state_key()``: a str naming the full state, GiGPO's anchor key (`anchor_key`: every manager,
  and arl's runners in proxy mode, group steps on its hash); the default is the grid text,
  override it when the text leaves something out (an inventory, a key, a counter), or steps in
  different states share one anchor group; ``info["success"]`` at each step.
- ``step(None)``: a no-op turn (the wrapper's move for an unparseable reply).

A game must survive ``copy.deepcopy`` (forked anchor groups copy the env: `arl.envs.fork`), or
provide ``fork()``, or say ``forkable = False``. Optional, for `TextEnv`'s extra lines: ``position_symbols`` (what ``positions=True`` locates);
``action_deltas`` (one (d_row, d_col) per action), ``player_symbols`` and ``goal_symbol`` (what
``surroundings=True`` looks at).

`check_game` enforces the required part (`TextEnv` calls it); `register_game` registers an id
in one call. A game outside ``arl/envs`` needs nothing else: tests/train/test_game_contract.py
trains two steps on one whose actions are not directions.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Literal

import gymnasium as gym


def state_hash(observation: str) -> str:
    """sha256 hex[:16] of a text: GiGPO's anchor key is this hash of a game's ``state_key()``
    (`anchor_key`), or of the observation text for an env that is not an arl game (and of the
    latest user/tool message in proxy mode when the runner reports no state: docs/reference.md §2).
    One hash everywhere, so equal states group wherever they were played.

    >>> state_hash("P_\\n_G")
    '757107e320fda516'
    """
    return hashlib.sha256(observation.encode("utf-8")).hexdigest()[:16]


StateKeySource = Literal["game", "observation"]


def game_state_key(env: Any) -> str | None:
    """The ``state_key()`` of the arl game under ``env``'s wrappers, or None for an env that is none.

    The game is reached as `fork_env` reaches it, ``env.unwrapped`` (gymnasium's wrappers, `TextEnv`
    and `ToolEnv` all lead there); an env whose unwrapped object has no callable ``state_key`` is
    not an arl game. A ``state_key()`` that returns anything but a str is a broken game: TypeError
    (a str is what `state_hash` hashes, and ``repr`` of an arbitrary object need not be stable).

    >>> from arl.envs.text import TextEnv
    >>> env = TextEnv("arl/FrozenLake-v0", positions=True)
    >>> _ = env.reset(seed=0)
    >>> game_state_key(env) == env.unwrapped.grid_text(), game_state_key(object())
    (True, None)
    """
    key_fn = getattr(getattr(env, "unwrapped", env), "state_key", None)
    if not callable(key_fn):
        return None
    key = key_fn()
    if not isinstance(key, str):
        raise TypeError(f"{type(env.unwrapped).__name__}.state_key() must return a str, got {type(key).__name__}")
    return key


def anchor_key(env: Any, observation: str) -> tuple[str, StateKeySource]:
    """GiGPO's anchor key of the state ``env`` is in, and where it came from.

    - ``(state_hash(game.state_key()), "game")`` for an arl game (`game_state_key`): the full
      state, including what the text leaves out (an inventory, a counter);
    - ``(state_hash(observation), "observation")`` for an env that is not an arl game: the text it
      shows is all there is to key on. Managers record the source per turn
      (``Turn.info["state_key_source"]``, metric ``rollout/state_key_fallback_rate``), so a
      fallback is never silent.

    Taken *before* the step: the key names the state the action was taken in. For the shipped
    games the key is a one-to-one image of the grid text, so anchor groups are those the text
    gives; with the default text (no ``cell_separator``, ``positions``, ``surroundings``, the
    default Sokoban vocabulary) the key equals ``state_hash(observation)``.

    >>> from arl.envs.text import TextEnv
    >>> env = TextEnv("arl/FrozenLake-v0")
    >>> obs, _ = env.reset(seed=0)
    >>> anchor_key(env, obs) == (state_hash(obs), "game"), anchor_key(object(), "P_G")
    (True, ('5a95b70e04c2ce2b', 'observation'))
    """
    key = game_state_key(env)
    if key is None:
        return state_hash(observation), "observation"
    return state_hash(key), "game"


REQUIRED = ("action_names", "game_name", "description", "default_format_penalty", "symbols", "symbol_names",
            "grid_text", "state_key", "symbol_legend")


class Game(gym.Env):
    """Base of arl's grid games: declares the contract in the module docstring, writes the legend."""

    action_names: ClassVar[list[str]]
    game_name: ClassVar[str]
    description: str
    default_format_penalty: ClassVar[float] = 0.0
    symbols: str
    symbol_names: dict[str, str]

    def grid_text(self) -> str:
        """The board as text, one row per line: each game defines it (the contract, not a stub)."""
        raise NotImplementedError(f"{type(self).__name__} must define grid_text()")

    def state_key(self) -> str:
        """GiGPO's anchor key, a str naming the whole state (`anchor_key` hashes it before each
        step): by default the grid text; override it when the text hides state."""
        return self.grid_text()

    def symbol_legend(self) -> str:
        """``"_: frozen, O: hole, ..."``: one entry per symbol, in ``symbol_names``' order."""
        return ", ".join(f"{s}: {name}" for s, name in self.symbol_names.items())


def check_game(game: Any) -> None:
    """Raise TypeError naming what ``game`` (an unwrapped env) lacks of the `Game` contract."""
    missing = [attr for attr in REQUIRED if not hasattr(game, attr)]
    if missing:
        raise TypeError(f"{type(game).__name__} is not an arl game (missing {', '.join(map(repr, missing))}); "
                        "subclass arl.envs.Game")
    names = list(game.action_names)
    if not names or len(set(names)) != len(names) or not all(isinstance(n, str) and n.strip() == n and n
                                                             for n in names):
        raise TypeError(f"{type(game).__name__}.action_names must be distinct non-empty words, got {names!r}")
    unnamed = set(game.symbols) - set(game.symbol_names)
    if unnamed:
        raise TypeError(f"{type(game).__name__}.symbol_names has no word for {''.join(sorted(unnamed))!r}")


def register_game(env_id: str, game: type[Game] | str, *, max_episode_steps: int, **kwargs: Any) -> None:
    """Register ``env_id`` for ``game`` (a class or ``"module:Class"``) with a step limit; idempotent.

    The step limit is gymnasium's TimeLimit, which is what makes an unparseable reply's wasted
    turn count (docs/architecture.md §6).
    """
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=game, max_episode_steps=int(max_episode_steps), kwargs=kwargs)
