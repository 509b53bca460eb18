"""Configs are checked before anything is built (issue 44 §4): an env id, estimator or runner that
does not resolve fails with its field's dotted path, and a start that failed before its first
training step leaves nothing that blocks its retry."""

from __future__ import annotations

import pytest
from outside_arl import LAMPS_GAME, user_module
from trainer_support import scripted, small_config

from arl.config import ConfigError, load_config
from arl.train import Trainer
from arl.train.checks import check_config, config_problems

pytestmark = pytest.mark.anyio

CRASHING_AGENT = '''
class Crashing:
    def __init__(self, client):
        self.client = client

    async def run_job(self, seed):
        raise RuntimeError("this agent always fails")


def crashing(client, spec, config):
    return Crashing(client)
'''


def user_code(tmp_path, monkeypatch) -> str:
    """The Lamps game (registered as mine/Lamps-v0) and a runner factory whose agent always fails."""
    return user_module(tmp_path, monkeypatch, LAMPS_GAME + "\n\n" + CRASHING_AGENT)


def test_each_name_that_does_not_resolve_is_one_line_with_its_dotted_path(tmp_path, monkeypatch):
    mod = user_code(tmp_path, monkeypatch)
    bad = load_config(None, ["rollout.env_id=arl/FrozenLake-v9", "algo.estimator=ppo", "rollout.mode=proxy",
                             "rollout.proxy.runner=no_such_pkg_xyz.agents:make", "sft.steps=1"])
    with pytest.raises(ConfigError) as err:
        check_config(bad)
    lines = str(err.value).splitlines()[1:]
    assert [line.rsplit(" @ ", 1)[1] for line in lines] == ["rollout.env_id", "algo.estimator", "rollout.proxy.runner"]
    assert "arl/FrozenLake-v9" in lines[0] and "arl/FrozenLake-v0" in lines[0]  # what is there
    assert "cannot import 'no_such_pkg_xyz.agents'" in lines[2]
    # gymnasium's module:id form imports the user's module, where the game registers itself
    good = load_config(None, [f"rollout.env_id={mod}:mine/Lamps-v0", f"rollout.proxy.runner={mod}:crashing",
                              "rollout.mode=proxy"])
    assert check_config(good) is good
    assert config_problems(load_config(None, [f"rollout.env_id={mod}:mine/Nope-v0"]))[0][0] == "rollout.env_id"
    # a custom agent may use the env id as a label; arl's own runners and the warm-start play it
    label = ["rollout.mode=proxy", f"rollout.proxy.runner={mod}:crashing", "rollout.env_id=my-task-set"]
    assert config_problems(load_config(None, label)) == []
    assert [p for p, _ in config_problems(load_config(None, [*label, "sft.steps=2"]))] == ["rollout.env_id"]
    perception = [*label, "sft.perception_steps=2", "rollout.manager.observation=image"]
    assert [p for p, _ in config_problems(load_config(None, perception))] == ["rollout.env_id"]
    assert [p for p, _ in config_problems(load_config(None, ["rollout.manager.fork.k=2",
                                                             "rollout.manager.fork.at=nope_xyz:rule"]))] == [
        "rollout.manager.fork.at"]


def test_the_trainer_checks_before_it_builds_anything(tmp_path):
    config = small_config(tmp_path, "rollout.env_id=Nope-v0")
    with pytest.raises(ConfigError, match=r"unknown env id 'Nope-v0'.* @ rollout\.env_id"):
        Trainer(config)
    assert not (tmp_path / "t").exists()


def test_load_config_names_the_field_itself():
    with pytest.raises(ConfigError, match=r"must be in \('traj', 'step', 'proxy'\) \(got 'x'\) @ rollout\.mode$"):
        load_config(None, ["rollout.mode=x"])
    with pytest.raises(ConfigError, match=r"must be >= 0: -1 @ steps$"):
        load_config(None, ["steps=-1"])


async def test_a_start_that_failed_before_its_first_step_does_not_block_the_retry(tmp_path, monkeypatch):
    from arl.rollout.scheduler import BatchFailedError

    mod = user_code(tmp_path, monkeypatch)
    broken = small_config(tmp_path, "rollout.mode=proxy", f"rollout.proxy.runner={mod}:crashing", "steps=1")
    async with Trainer(broken, engine=scripted(broken)) as trainer:
        with pytest.raises(BatchFailedError, match="this agent always fails"):
            await trainer.train()
    assert (tmp_path / "t" / "metrics.jsonl").exists()  # what the failed start left
    fixed = small_config(tmp_path, "steps=1")  # the same run directory, no --overwrite, no --resume
    async with Trainer(fixed, engine=scripted(fixed)) as trainer:
        history = await trainer.train()
    assert [row["step"] for row in history if "rollout/num_episodes" in row] == [1]
    # a run that trained a step is a run: a fresh start there is refused, as before
    again = small_config(tmp_path, "steps=1")
    with pytest.raises(Exception, match="already holds a run"):
        async with Trainer(again, engine=scripted(again)) as trainer:
            await trainer.setup()
