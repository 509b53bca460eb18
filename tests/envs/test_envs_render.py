"""RGB frames of the games (issue 46 item 1): gymnasium's rgb_array convention, one 28 px sprite per
cell (one Qwen2-VL image token per cell), frames that follow the state, and `arl play --render`."""

from __future__ import annotations

import doctest

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import arl.envs  # noqa: F401  (registers the ids)
from arl.envs import render
from arl.envs.render import CELL_PX, image_tokens

GAMES = {"arl/FrozenLake-v0": (4, 4), "arl/Sokoban-v0": (6, 6)}


def test_doctests():
    failures, tried = doctest.testmod(render)
    assert tried >= 3 and failures == 0


@pytest.mark.parametrize("env_id", sorted(GAMES))
def test_rgb_array_is_gymnasiums_convention(env_id):
    env = gym.make(env_id, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    rows, cols = GAMES[env_id]
    assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8
    assert frame.shape == (rows * CELL_PX, cols * CELL_PX, 3)
    assert image_tokens(*frame.shape[:2]) == rows * cols  # one image token per cell
    check_env(env.unwrapped, skip_render_check=False)
    assert gym.make(env_id, render_mode="ansi").unwrapped.render_mode == "ansi"  # the text mode stays


@pytest.mark.parametrize("env_id", sorted(GAMES))
def test_each_cell_is_its_codes_sprite(env_id):
    env = gym.make(env_id, render_mode="rgb_array").unwrapped
    obs, _ = env.reset(seed=1)
    frame = env.frame()
    sprites = render.frozen_lake_sprites() if "Frozen" in env_id else render.sokoban_sprites()
    assert len({s.tobytes() for s in sprites}) == len(sprites)  # every cell code looks different
    for r, c in np.ndindex(obs.shape):
        tile = frame[r * CELL_PX:(r + 1) * CELL_PX, c * CELL_PX:(c + 1) * CELL_PX]
        assert np.array_equal(tile, sprites[obs[r, c]])


def test_frame_follows_the_state():
    env = gym.make("arl/FrozenLake-v0", render_mode="rgb_array").unwrapped
    env.reset(options={"map": ["PFFF", "FFFF", "FFFF", "FFFG"]})
    before = env.frame()
    env.step(2)  # Right
    after = env.frame()
    assert not np.array_equal(before, after)
    assert np.array_equal(after[:CELL_PX, CELL_PX:2 * CELL_PX], render.frozen_lake_sprites()[3])  # the player


def test_sokoban_frame_ignores_the_vocabulary():
    a = gym.make("arl/Sokoban-v0").unwrapped
    b = gym.make("arl/Sokoban-v0", vocabulary="alt").unwrapped
    a.reset(seed=5)
    b.reset(seed=5)
    assert a.grid_text() != b.grid_text() and np.array_equal(a.frame(), b.frame())


def test_bad_codes_and_sizes_are_refused():
    with pytest.raises(ValueError, match="cell codes"):
        render.render_codes([[9]], render.sokoban_sprites())
    with pytest.raises(ValueError, match="whole number"):
        image_tokens(100, 112)


def test_play_render_saves_frames(tmp_path, monkeypatch, capsys):
    import io

    from PIL import Image

    from arl.envs.play import main

    monkeypatch.setattr("sys.stdin", io.StringIO("dd\nq\n"))
    assert main(["arl/FrozenLake-v0", "--seed", "3", "--line", "--render", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["step_000.png", "step_001.png", "step_002.png"]
    img = np.asarray(Image.open(tmp_path / "step_000.png"))
    assert img.shape == (4 * CELL_PX, 4 * CELL_PX, 3)
