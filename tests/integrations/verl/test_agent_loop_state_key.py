"""The verl agent loop's ``arl_state_keys`` are the game's ``state_key()`` hashes, in traj and proxy
mode, and ``arl_state_key_sources`` says so (issue 43 item 2): a game whose grid never changes but
whose hidden counter does gets one anchor key per hidden state, not one for the whole episode."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from arl.engine.scripted import ScriptedEngine
from arl.envs import Game, register_game
from arl.envs.game import state_hash

pytestmark = pytest.mark.anyio

HIDDEN_ID = "arl_test/HiddenPressesVerl-v0"
WAIT_PRESS = ["<answer>Wait</answer>", "<answer>Press</answer>"]  # hidden counts 0, 0, 1, 1, 2, 2


class HiddenPresses(Game):
    """"Press" counts (unseen), the third press wins; the grid is always "#o#" (as in
    tests/rollout/test_state_key.py)."""

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
        self.presses += action == 0
        won = self.presses >= 3
        return np.zeros((1, 3), dtype=np.int8), float(won), won, False, {"success": won, "action_effective": action == 0}

    def grid_text(self) -> str:
        return "#o#"

    def state_key(self) -> str:
        return f"#o#|presses={self.presses}"


register_game(HIDDEN_ID, HiddenPresses, max_episode_steps=8)


@pytest.mark.parametrize("mode", ["traj", "proxy"])
async def test_state_keys_are_the_games_not_the_texts(make_loop, tiny_tokenizer, mode):
    engine = ScriptedEngine(tiny_tokenizer, responses=WAIT_PRESS)
    loop, server = make_loop(engine, {"mode": mode, "manager": {"max_tokens": 16}})
    row = {"extra_info": {"env_id": HIDDEN_ID, "seed": 0, "tag": "train", "index": 0}, "uid": "u0",
           "session_id": 0, "raw_prompt": [{"role": "user", "content": "play"}]}
    out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **row)
    assert out.extra_fields["arl_success"] and len(server.calls) == 6
    assert out.extra_fields["arl_state_keys"] == [state_hash(f"#o#|presses={c}") for c in (0, 0, 1, 1, 2, 2)]
    assert out.extra_fields["arl_state_key_sources"] == ["game"] * 6
