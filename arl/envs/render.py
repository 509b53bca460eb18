"""RGB frames of the grid games (``render_mode="rgb_array"``, gymnasium's convention), drawn with numpy.

A frame is ``uint8[rows * CELL_PX, cols * CELL_PX, 3]``: one sprite per cell, looked up by the
cell code of the game's Box observation. The sprites are drawn here procedurally (flat colours,
discs, rings, rectangles), so arl ships no image files and downloads nothing.

Why ``CELL_PX = 28``: a Qwen2-VL-family vision tower cuts an image into 14 x 14 px patches and
merges 2 x 2 neighbouring patches into one image token, so one token covers 14 * 2 = 28 px
square. With 28 px cells, every cell is exactly one image token and no token straddles two
cells: a 4x4 FrozenLake frame is 112 x 112 px = (112 / 28)^2 = 16 tokens, a 6x6 Sokoban frame
168 x 168 px = 36 tokens. Qwen2-VL's image processor resizes an image to multiples of 28 px
(its ``smart_resize``), so a frame whose sides already are multiples of 28 (and whose area is
inside the processor's ``min_pixels``/``max_pixels``) reaches the model unscaled.

>>> frame = render_codes(np.array([[0, 1], [2, 3]]), frozen_lake_sprites())
>>> frame.shape, frame.dtype, image_tokens(frame.shape[0], frame.shape[1])
((56, 56, 3), dtype('uint8'), 4)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

PATCH_PX = 14  # Qwen2-VL's vision patch side
MERGE = 2  # Qwen2-VL merges MERGE x MERGE patches into one image token
CELL_PX = PATCH_PX * MERGE  # 28: one cell = one image token

Color = tuple[int, int, int]


def image_tokens(height: int, width: int, patch_px: int = PATCH_PX, merge: int = MERGE) -> int:
    """Image tokens a Qwen2-VL-family model spends on an unscaled ``height x width`` frame whose
    sides are multiples of ``patch_px * merge``: ``(height / (patch_px*merge)) * (width / (patch_px*merge))``.

    >>> image_tokens(112, 112), image_tokens(168, 168)
    (16, 36)
    """
    unit = patch_px * merge
    if height % unit or width % unit:
        raise ValueError(f"a {height}x{width} frame is not a whole number of {unit}px image tokens")
    return (height // unit) * (width // unit)


def _grid(cell: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates of a cell, in cell units (0..1)."""
    c = (np.arange(cell) + 0.5) / cell
    return np.meshgrid(c, c, indexing="ij")


def _fill(cell: int, color: Color) -> np.ndarray:
    return np.broadcast_to(np.array(color, np.uint8), (cell, cell, 3)).copy()


def _paint(img: np.ndarray, mask: np.ndarray, color: Color) -> np.ndarray:
    img[mask] = color
    return img


def _disc(cell: int, cy: float, cx: float, r: float) -> np.ndarray:
    y, x = _grid(cell)
    return (y - cy) ** 2 + (x - cx) ** 2 <= r * r


def _box(cell: int, top: float, left: float, bottom: float, right: float) -> np.ndarray:
    y, x = _grid(cell)
    return (y >= top) & (y <= bottom) & (x >= left) & (x <= right)


def _figure(img: np.ndarray, color: Color) -> np.ndarray:
    """A player: a head and a body, over whatever ``img`` shows."""
    cell = img.shape[0]
    _paint(img, _box(cell, 0.45, 0.3, 0.88, 0.7), color)
    return _paint(img, _disc(cell, 0.3, 0.5, 0.17), color)


@functools.lru_cache(maxsize=8)
def frozen_lake_sprites(cell: int = CELL_PX) -> np.ndarray:
    """``uint8[6, cell, cell, 3]`` in FrozenLake's cell-code order: frozen, hole, goal, player,
    player in hole, player on goal (`arl.envs.frozen_lake`)."""
    ice: Color = (200, 230, 245)
    frozen = _fill(cell, ice)
    frozen[[0, -1], :] = frozen[:, [0, -1]] = (170, 205, 225)  # the cell border: the grid stays countable
    hole = _paint(frozen.copy(), _disc(cell, 0.5, 0.5, 0.38), (20, 40, 90))
    goal = _paint(frozen.copy(), _box(cell, 0.15, 0.15, 0.85, 0.85), (40, 170, 60))
    player = _figure(frozen.copy(), (220, 40, 40))
    in_hole = _figure(hole.copy(), (120, 20, 20))
    on_goal = _figure(goal.copy(), (250, 210, 40))
    sprites = np.stack([frozen, hole, goal, player, in_hole, on_goal])
    sprites.setflags(write=False)
    return sprites


@functools.lru_cache(maxsize=8)
def sokoban_sprites(cell: int = CELL_PX) -> np.ndarray:
    """``uint8[7, cell, cell, 3]`` in Sokoban's cell-code order: wall, empty, target, box on
    target, box, player, player on target (`arl.envs.sokoban`)."""
    wall = _fill(cell, (150, 80, 50))
    wall[:: max(1, cell // 4), :] = (90, 50, 30)  # mortar lines
    empty = _fill(cell, (60, 60, 60))
    target = empty.copy()
    ring = _box(cell, 0.2, 0.2, 0.8, 0.8) & ~_box(cell, 0.32, 0.32, 0.68, 0.68)
    _paint(target, ring, (230, 60, 60))

    def crate(base: np.ndarray, color: Color) -> np.ndarray:
        img = _paint(base.copy(), _box(cell, 0.1, 0.1, 0.9, 0.9), color)
        y, x = _grid(cell)
        cross = (np.abs(y - x) < 0.07) | (np.abs(y + x - 1) < 0.07)
        return _paint(img, cross & _box(cell, 0.1, 0.1, 0.9, 0.9), (90, 60, 20))

    box_on_target = crate(target, (60, 200, 80))
    box = crate(empty, (230, 170, 40))
    player = _figure(empty.copy(), (60, 120, 250))
    player_on_target = _figure(target.copy(), (60, 120, 250))
    sprites = np.stack([wall, empty, target, box_on_target, box, player, player_on_target])
    sprites.setflags(write=False)
    return sprites


def render_codes(codes: np.ndarray | Sequence[Sequence[int]], sprites: np.ndarray) -> np.ndarray:
    """The frame of a grid of cell codes: ``sprites[codes[r, c]]`` tiled, ``uint8[R*cell, C*cell, 3]``.

    >>> render_codes([[1]], sokoban_sprites()).shape
    (28, 28, 3)
    """
    codes = np.asarray(codes, dtype=np.intp)
    if codes.ndim != 2:
        raise ValueError(f"cell codes must be a 2-D grid, got shape {codes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() >= len(sprites)):
        raise ValueError(f"cell codes must be in [0, {len(sprites)}), got {codes.min()}..{codes.max()}")
    rows, cols = codes.shape
    cell = sprites.shape[1]
    tiles = sprites[codes]  # (R, C, cell, cell, 3)
    return np.ascontiguousarray(tiles.transpose(0, 2, 1, 3, 4).reshape(rows * cell, cols * cell, 3))


__all__ = ["CELL_PX", "MERGE", "PATCH_PX", "frozen_lake_sprites", "image_tokens", "render_codes", "sokoban_sprites"]
