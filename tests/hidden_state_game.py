"""A game whose text hides its state, shared by the state-key tests (tests/rollout/test_state_key.py,
tests/integrations/verl/test_agent_loop_state_key.py): the grid is always "#o#" while a hidden
counter (the presses so far) decides the game, so a key taken from the observation text puts every
turn in one anchor group and only the game's ``state_key()`` tells the states apart. Importing
this module registers it as ``HIDDEN_ID``."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from arl.envs import Game, register_game

HIDDEN_ID = "arl_test/HiddenPresses-v0"
PRESSES_TO_WIN = 3
WAIT_PRESS = ["<answer>Wait</answer>", "<answer>Press</answer>"]  # hidden counts 0, 0, 1, 1, 2, 2


class HiddenPresses(Game):
    """A button behind a wall: "Press" counts (unseen), the third press wins; the grid is always "#o#"."""

    action_names = ["Press", "Wait"]
    game_name = "hidden presses"
    description = "Press the button three times. The board does not show how often you pressed."
    symbols = "#o"
    symbol_names = {"#": "wall", "o": "button"}

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 1, (1, 3), dtype=np.int8)
        self.action_space = spaces.Discrete(2)
        self.presses = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.presses = 0
        return np.zeros((1, 3), dtype=np.int8), {"success": False}

    def step(self, action):
        if action == 0:
            self.presses += 1
        won = self.presses >= PRESSES_TO_WIN
        return np.zeros((1, 3), dtype=np.int8), float(won), won, False, {"success": won, "action_effective": action == 0}

    def grid_text(self) -> str:
        return "#o#"

    def state_key(self) -> str:
        return f"{self.grid_text()}|presses={self.presses}"


register_game(HIDDEN_ID, HiddenPresses, max_episode_steps=8)
