"""A game written outside arl/envs, with actions that are not directions, trains from the Game contract alone."""

from __future__ import annotations

import importlib

import pytest
from outside_arl import LAMPS_GAME, user_module
from trainer_support import small_config

from arl.engine import make_engine
from arl.envs import TextEnv, check_game
from arl.train import Trainer

pytestmark = pytest.mark.anyio


@pytest.fixture
def Lamps(tmp_path, monkeypatch):  # noqa: N802 - the user's class
    """The user's game module (`outside_arl.LAMPS_GAME`: four lamps, "Light" lights the next, "Wait"
    does nothing), imported from outside arl; it registers mine/Lamps-v0."""
    return importlib.import_module(user_module(tmp_path, monkeypatch, LAMPS_GAME, "lamps")).Lamps


def test_the_contract_names_what_is_missing(Lamps):  # noqa: N803
    class NoLegend(Lamps):
        symbol_names = {"o": "lamp off"}

    check_game(Lamps())
    with pytest.raises(TypeError, match=r"no word for '\*'"):
        TextEnv(NoLegend())
    env = TextEnv("mine/Lamps-v0")
    assert "o: lamp off, *: lamp on" in env.instructions and "Light, Wait" in env.instructions


async def test_a_game_with_non_directional_actions_trains_two_steps_with_the_warm_start(tmp_path, Lamps):  # noqa: N803
    config = small_config(tmp_path, "rollout.env_id=mine/Lamps-v0", "sft.steps=1", "sft.batch_episodes=4")
    engine = make_engine(backend="scripted", model=config.model, max_model_len=1024,
                         scripted={"invalid_rate": 0.2, "actions": ["Light", "Wait"]})
    async with Trainer(config, engine=engine) as trainer:
        await trainer.setup()
        history = await trainer.train()
    rows = [row for row in history if "rollout/valid_action_rate" in row]
    assert len(rows) == 2 and all(row["rollout/valid_action_rate"] > 0 for row in rows)
    assert next(row for row in history if "sft/steps" in row)["sft/steps"] == 1
