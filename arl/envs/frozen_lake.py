"""FrozenLake with a fresh random solvable map per episode (docs/reference.md §1.2).

gymnasium's own FrozenLake draws a random map only through `generate_random_map(seed=...)`, which
builds its own generator and always puts the start top-left and the goal bottom-right. arl's
variant needs a random start and goal and all randomness from `self.np_random`, so the map
generation lives here. Actions match gymnasium: 0 Left, 1 Down, 2 Right, 3 Up.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from gymnasium import spaces

from arl.envs.game import Game
from arl.envs.render import frozen_lake_sprites, render_codes

# Observation cell codes.
FROZEN, HOLE, GOAL, PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = range(6)
SYMBOLS = "_OGPX√"
_LEGEND_NAMES = ("frozen", "hole", "goal", "player", "player in hole", "player on goal")

# Left, Down, Right, Up as (d_row, d_col). (a - 1) % 4 and (a + 1) % 4 are the perpendiculars.
_DIRECTIONS = ((0, -1), (1, 0), (0, 1), (-1, 0))

# Letters accepted by `reset(options={"map": ...})`: gymnasium's S/F/H/G and arl's own symbols.
_MAP_LETTERS = {
    "S": "start",
    "P": "start",
    "F": "frozen",
    "_": "frozen",
    "H": "hole",
    "O": "hole",
    "G": "goal",
}


def has_path(holes: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> bool:
    """Breadth-first search over non-hole cells."""
    n_rows, n_cols = holes.shape
    seen = {start}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return True
        for dr, dc in _DIRECTIONS:
            rr, cc = r + dr, c + dc
            if 0 <= rr < n_rows and 0 <= cc < n_cols and not holes[rr, cc] and (rr, cc) not in seen:
                seen.add((rr, cc))
                queue.append((rr, cc))
    return False


class FrozenLakeEnv(Game):
    """Reach the goal without falling into a hole; +1 at the goal, else 0.

    Observation: ``Box(0, 5, (size, size), int8)`` of cell codes (FROZEN ... PLAYER_ON_GOAL). The
    map changes every reset (holes with probability ``1 - p``, random distinct start and goal,
    redrawn until a path exists). Slippery: the intended move w.p. 1/3, each perpendicular 1/3.
    Moving into the border leaves the player in place (``action_effective`` False).
    ``step(None)`` is a no-op turn (reward 0), used by wrappers for unparseable answers.
    ``reset(options={"map": ["SFFF", "FHFH", ...]})`` loads a fixed map (S/F/H/G or P/_/O/G).
    The step limit is enforced by the TimeLimit of the registered ids, not here.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    action_names: list[str] = ["Left", "Down", "Right", "Up"]
    game_name = "frozen_lake"
    default_format_penalty = -0.01  # ROLL (docs/reference.md §1.3)
    symbols = SYMBOLS
    position_symbols = "PX√GO"  # what TextEnv(positions=True) locates, player first: all but frozen floor
    action_deltas = _DIRECTIONS  # what TextEnv(surroundings=True) looks at, one per action name
    player_symbols = "PX√"
    goal_symbol = "G"
    symbol_names = dict(zip(SYMBOLS, _LEGEND_NAMES, strict=True))

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if size < 2:
            raise ValueError("size must be >= 2")
        if not 0.0 < p <= 1.0:
            raise ValueError("p (probability a tile is frozen) must be in (0, 1]")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"unsupported render_mode {render_mode!r}")
        self.size = int(size)
        self.p = float(p)
        self.is_slippery = bool(is_slippery)
        self.render_mode = render_mode
        self.action_names = list(FrozenLakeEnv.action_names)
        self.observation_space = spaces.Box(low=0, high=5, shape=(size, size), dtype=np.int8)
        self.action_space = spaces.Discrete(4)
        self._holes = np.zeros((size, size), dtype=bool)
        self._goal = (size - 1, size - 1)
        self._player = (0, 0)

    @property
    def description(self) -> str:
        text = (
            "You are walking on a frozen lake. You are the player and you need to reach the goal "
            "without falling into a hole. Each move takes you one cell; moving off the edge of the "
            "lake leaves you where you are."
        )
        if self.is_slippery:
            text += (
                " The ice is slippery: you move in the intended direction only one time in three, "
                "otherwise you slide to one of the two perpendicular directions."
            )
        return text

    # ------------------------------------------------------------------ generation
    def _generate(self) -> None:
        n, rng = self.size, self.np_random
        while True:  # p > 0 and start != goal: a path exists with positive probability
            holes = rng.random((n, n)) >= self.p
            start_i, goal_i = (int(i) for i in rng.choice(n * n, size=2, replace=False))
            start, goal = divmod(start_i, n), divmod(goal_i, n)
            holes[start] = holes[goal] = False
            if has_path(holes, start, goal):
                self._holes, self._player, self._goal = holes, start, goal
                return

    def _load_map(self, rows: Any) -> None:
        n = self.size
        if isinstance(rows, str):
            rows = rows.strip("\n").split("\n")
        rows = [str(r) for r in rows]
        if len(rows) != n or any(len(r) != n for r in rows):
            raise ValueError(f"map must be {n}x{n}, got {rows!r}")
        holes = np.zeros((n, n), dtype=bool)
        starts, goals = [], []
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                kind = _MAP_LETTERS.get(ch)
                if kind is None:
                    raise ValueError(f"unknown map letter {ch!r}")
                holes[r, c] = kind == "hole"
                if kind == "start":
                    starts.append((r, c))
                elif kind == "goal":
                    goals.append((r, c))
        if len(starts) != 1 or len(goals) != 1:
            raise ValueError("map needs exactly one start and one goal")
        self._holes, self._player, self._goal = holes, starts[0], goals[0]

    # ------------------------------------------------------------------ gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if options and options.get("map") is not None:
            self._load_map(options["map"])
        else:
            self._generate()
        return self._obs(), self._info(False)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        moved = False
        if action is not None:
            a = int(action)
            if not 0 <= a < 4:
                raise ValueError(f"action must be in 0..3 (or None for a no-op), got {action!r}")
            if self.is_slippery:
                # Drawn even after the episode ended, so the RNG stream does not depend on it.
                a = (a + int(self.np_random.integers(-1, 2))) % 4
            if not self._done():
                dr, dc = _DIRECTIONS[a]
                r, c = self._player[0] + dr, self._player[1] + dc
                if 0 <= r < self.size and 0 <= c < self.size:
                    self._player, moved = (r, c), True
        at_goal = self._player == self._goal
        reward = 1.0 if (at_goal and moved) else 0.0
        return self._obs(), reward, self._done(), False, self._info(moved)

    def render(self) -> str | np.ndarray | None:
        """gymnasium's convention: the grid text for ``"ansi"``, `frame()` for ``"rgb_array"``."""
        if self.render_mode == "ansi":
            return self.grid_text()
        return self.frame() if self.render_mode == "rgb_array" else None

    def frame(self) -> np.ndarray:
        """The lake as an RGB image, ``uint8[28*size, 28*size, 3]``: one 28 px sprite per cell, one
        image token per cell for a Qwen2-VL-family model (`arl.envs.render`); whatever the render mode."""
        return render_codes(self._obs(), frozen_lake_sprites())

    def solution(self) -> list[str] | None:
        """The gold solution from the current state: the shortest list of action names that
        walks to the goal around the holes (breadth-first search), [] at the goal, None where none
        exists (in a hole). On slippery ice a move may slip: `arl eval --oracle` asks again after
        every step, so it follows a shortest path from wherever it is, which does not always arrive.

        >>> env = FrozenLakeEnv(size=3); _ = env.reset(options={"map": ["SFF", "FHF", "FFG"]})
        >>> env.solution()
        ['Down', 'Down', 'Right', 'Right']
        """
        if self._holes[self._player]:
            return None
        n_rows, n_cols = self._holes.shape
        came: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {self._player: None}
        queue = deque([self._player])
        while queue:
            cell = queue.popleft()
            if cell == self._goal:
                path: list[str] = []
                while (step := came[cell]) is not None:
                    cell, a = step
                    path.append(self.action_names[a])
                return path[::-1]
            for a, (dr, dc) in enumerate(_DIRECTIONS):
                nxt = (cell[0] + dr, cell[1] + dc)
                if 0 <= nxt[0] < n_rows and 0 <= nxt[1] < n_cols and not self._holes[nxt] and nxt not in came:
                    came[nxt] = (cell, a)
                    queue.append(nxt)
        return None

    # ------------------------------------------------------------------ helpers
    def _done(self) -> bool:
        return bool(self._player == self._goal or self._holes[self._player])

    def _obs(self) -> np.ndarray:
        obs = self._holes.astype(np.int8)  # FROZEN 0 / HOLE 1
        obs[self._goal] = GOAL
        if self._player == self._goal:
            obs[self._player] = PLAYER_ON_GOAL
        elif self._holes[self._player]:
            obs[self._player] = PLAYER_IN_HOLE
        else:
            obs[self._player] = PLAYER
        return obs

    def _info(self, moved: bool) -> dict[str, Any]:
        return {"success": self._player == self._goal, "action_effective": moved}

    def grid_text(self) -> str:
        """The lake as text: one symbol per cell, rows joined by "\\n"."""
        return "\n".join("".join(SYMBOLS[c] for c in row) for row in self._obs().tolist())
