"""What the tests of a user's own code share: modules written outside arl (into tmp_path, put on
sys.path), and `arl` run in the test's own process."""

from __future__ import annotations

import logging
import uuid

LAMPS_GAME = '''
import numpy as np
from gymnasium import spaces
from arl.envs import Game, register_game


class Lamps(Game):
    """Four lamps; "Light" lights the next one. Light all four."""

    action_names = ["Light", "Wait"]
    game_name = "lamps"
    description = "Four lamps stand in a row. Light them all, one per turn, left to right."
    default_format_penalty = -0.05
    symbols = "o*"
    symbol_names = {"o": "lamp off", "*": "lamp on"}

    def __init__(self):
        self.observation_space = spaces.Box(0, 1, (1, 4), dtype=np.int8)
        self.action_space = spaces.Discrete(2)
        self.lit = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.lit = 0
        return self._obs(), {"success": False}

    def step(self, action):
        if action == 0 and self.lit < 4:
            self.lit += 1
        done = self.lit == 4
        return self._obs(), float(done), done, False, {"success": done, "action_effective": action == 0}

    def _obs(self):
        return np.array([[1] * self.lit + [0] * (4 - self.lit)], dtype=np.int8)

    def grid_text(self):
        return "*" * self.lit + "o" * (4 - self.lit)


register_game("mine/Lamps-v0", Lamps, max_episode_steps=6)
'''


def user_module(tmp_path, monkeypatch, source: str, prefix: str = "user_code") -> str:
    """``source`` as a module of the user's own, outside arl, on sys.path for this test; its
    name, unique per call (a module name is imported once per process)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def arl_main(*argv: str) -> int:
    """``arl *argv``'s exit status; the log handlers it adds to the root logger are removed after."""
    from arl.cli import main

    root = logging.getLogger()
    before = list(root.handlers)
    try:
        return main(list(argv))
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
            handler.close()


def one_cheap_step(out_dir, name: str = "t") -> list[str]:
    """Overrides that make the packaged demo config one cheap training step into out_dir/name: the
    scripted engine, a small batch, no warm-start, one small evaluation at the end."""
    return [f"out_dir={out_dir}", f"name={name}", "steps=1", "engine.backend=scripted", "sft.steps=0",
            "tensorboard=false", "rollout.num_groups=2", "rollout.group_size=4", "eval.num_seeds=4",
            "eval.at_start=false", "eval.every=0", "algo.kl_coef=0", "optim.micro_batch_size=8"]
