"""arl.algo.estimators: the one table from algo.estimator names to advantage functions, which the
trainer, benchmarks/credit.py and notebook 02 all call."""

from __future__ import annotations

import doctest
import types

import numpy as np
import pytest

from arl.algo import estimators, gigpo, grpo
from arl.config import ConfigError, load_config
from arl.engine import make_engine
from arl.rollout.records import Sample
from arl.train import Trainer


def _samples() -> list[Sample]:
    # two episodes of one group, two steps each; the first steps share a state (one anchor group)
    rows = [("e0", 0, "s0", 1.0, 0.0), ("e0", 1, "s1", 1.0, 1.0), ("e1", 0, "s0", 0.0, 0.0), ("e1", 1, "s2", 0.0, 0.0)]
    return [Sample(input_ids=[1, 2], response_mask=[0, 1], old_logprobs=[0, -1],
                   episode_score=ep, step_score=step_score, group_id="g", traj_id=traj, step=step, state_key=h)
            for traj, step, h, ep, step_score in rows]


def test_the_docstring_example_holds():
    failures, tried = doctest.testmod(estimators)
    assert tried > 0 and failures == 0


def test_each_builtin_name_gives_what_its_function_gives():
    samples, algo = _samples(), load_config(None).algo
    assert set(estimators.names()) >= {"grpo", "gigpo", "reinforce"}
    adv, stats = estimators.estimate("grpo", samples, algo)
    np.testing.assert_array_equal(adv, grpo([s.episode_score for s in samples], [s.group_id for s in samples]))
    adv, stats = estimators.estimate("gigpo", samples, algo)
    direct, direct_stats = gigpo([s.episode_score for s in samples], [s.step_score for s in samples],
                                 ["g"] * 4, [s.traj_id for s in samples], [s.step for s in samples],
                                 [s.state_key for s in samples], gamma=algo.gamma, step_weight=algo.step_weight,
                                 norm=algo.gigpo_norm)
    np.testing.assert_array_equal(adv, direct)
    assert stats == {**{f"gigpo_{k}": float(v) for k, v in direct_stats.items()},
                     "adv_abs_mean": float(np.abs(direct).mean())}
    assert estimators.estimate("gigpo", [], algo)[1] == {}


def test_a_registered_estimator_trains_and_an_unknown_name_is_refused(tmp_path):
    def constant(samples, settings):
        return np.full(len(samples), settings.step_weight), {"constant": 1.0}

    estimators.register("constant-test", constant)
    with pytest.raises(ValueError, match="already registered"):
        estimators.register("constant-test", lambda s, a: (np.zeros(len(s)), {}))
    engine = make_engine(backend="scripted", model="tiny", max_model_len=1024)
    trainer = Trainer(load_config(None, [f"out_dir={tmp_path}", "algo.estimator=constant-test",
                                         "algo.step_weight=2.5"]), engine=engine)
    adv, stats = trainer.advantages(_samples())
    assert adv.tolist() == [2.5] * 4 and stats == {"train/constant": 1.0, "train/adv_abs_mean": 2.5}
    # a config may name an estimator registered later, so loading accepts any name; the Trainer
    # refuses an unregistered one, naming the choices, before it builds anything
    config = load_config(None, [f"out_dir={tmp_path}", "algo.estimator=ppo"])
    with pytest.raises(ConfigError) as err:
        Trainer(config, engine=engine)
    assert all(w in str(err.value) for w in ("algo.estimator", "'ppo'", "grpo", "gigpo", "reinforce", "register"))


# -- an estimator in the user's own package, chosen by import path (issue 44 §4) -------------------

USER_ESTIMATORS = '''
import numpy as np

def half(samples, settings):
    """Every sample's advantage is 0.5; one stat."""
    return np.full(len(samples), 0.5), {"half_calls": 1.0}

def one_argument(samples):
    return np.zeros(len(samples)), {}

def too_few(samples, settings):
    return np.zeros(1), {}

NOT_A_FUNCTION = 3
'''


def user_module(tmp_path, monkeypatch) -> str:
    from outside_arl import user_module

    return user_module(tmp_path, monkeypatch, USER_ESTIMATORS, prefix="user_estimators")


def test_an_import_path_selects_an_estimator_in_the_users_package(tmp_path, monkeypatch):
    mod = user_module(tmp_path, monkeypatch)
    adv, stats = estimators.estimate(f"{mod}:half", _samples(), load_config(None).algo)
    assert adv.tolist() == [0.5] * 4 and stats == {"half_calls": 1.0, "adv_abs_mean": 0.5}
    assert f"{mod}:half" in estimators.names()  # registered under its import path: the next call is a look-up
    engine = make_engine(backend="scripted", model="tiny", max_model_len=1024)
    trainer = Trainer(load_config(None, [f"out_dir={tmp_path}", f"algo.estimator={mod}:half"]), engine=engine)
    assert trainer.advantages(_samples())[1] == {"train/half_calls": 1.0, "train/adv_abs_mean": 0.5}


@pytest.mark.parametrize(("attribute", "words"), [
    ("one_argument", ["must take (samples, settings)", "one_argument(samples)"]),
    ("NOT_A_FUNCTION", ["is a int, not a function of (samples, settings)"]),
    ("missing", ["has no 'missing'"]),
])
def test_an_import_path_that_gives_no_estimator_is_refused_by_name_before_anything_is_built(
        tmp_path, monkeypatch, attribute, words):
    mod = user_module(tmp_path, monkeypatch)
    with pytest.raises(ValueError) as err:
        estimators.resolve(f"{mod}:{attribute}")
    assert all(w in str(err.value) for w in words), str(err.value)
    with pytest.raises(ConfigError) as err:  # the trainer, before an engine or a run directory exists
        Trainer(load_config(None, [f"out_dir={tmp_path}", f"algo.estimator={mod}:{attribute}"]))
    assert "@ algo.estimator" in str(err.value) and all(w in str(err.value) for w in words)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="cannot import 'no_such_module_xyz'"):
        estimators.resolve("no_such_module_xyz:f")


def test_an_estimator_that_returns_the_wrong_shape_is_named():
    with pytest.raises(ValueError, match=r"returned advantages of shape \(1,\) for 4 samples"):
        estimators.register("too-few-test", lambda samples, settings: (np.zeros(1), {}))
        estimators.estimate("too-few-test", _samples(), None)


def test_arl_train_takes_an_estimator_from_the_users_package(tmp_path, monkeypatch):
    """`arl train ... algo.estimator=my_mod:my_fn`: no edit inside arl, the module imported by the CLI."""
    import json

    from outside_arl import arl_main, one_cheap_step

    mod = user_module(tmp_path, monkeypatch)
    rc = arl_main("train", "tiny_frozenlake_gigpo", *one_cheap_step(tmp_path), f"algo.estimator={mod}:half")
    assert rc == 0
    rows = [json.loads(line) for line in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    step = next(row for row in rows if row["step"] == 1 and "train/half_calls" in row)
    assert step["train/adv_abs_mean"] == 0.5



def test_reinforce_credits_a_step_with_its_return_to_go_and_a_trajectory_with_its_episode():
    """REINFORCE in step mode reads the discounted return from each step on (issue 44 §1: it read
    the immediate reward alone, so a step that led to the goal got nothing); in trajectory mode
    the episode score."""
    settings = types.SimpleNamespace(gamma=0.9)

    def row(r, total, traj, step):
        return types.SimpleNamespace(step_score=r, episode_score=total, traj_id=traj, step=step, score=r)

    steps = [row(0.0, 1.0, "a", 0), row(0.0, 1.0, "a", 1), row(1.0, 1.0, "a", 2), row(-0.1, -0.1, "b", 0)]
    adv, _ = estimators.estimate("reinforce", steps, settings)
    np.testing.assert_allclose(adv, [0.81, 0.9, 1.0, -0.1])
    trajectories = [row(0.7, 0.7, "a", 0), row(0.2, 0.2, "b", 0)]
    np.testing.assert_allclose(estimators.estimate("reinforce", trajectories, settings)[0], [0.7, 0.2])
    branches = [row(0.5, 0.5, "a", 0), row(0.5, 0.5, "a", 0)]  # the proxy tracker's branches of one episode
    np.testing.assert_allclose(estimators.estimate("reinforce", branches, settings)[0], [0.5, 0.5])


def test_algo_config_sets_gigpo_episode_conventions():
    """algo.episode_stats / algo.singleton reach arl.algo.gigpo from the trainer's AlgoConfig (verl-agent's
    conventions are a config override, not a custom estimator)."""
    # group "a" holds one episode of two steps, group "b" one episode of one step: both singleton episode groups
    S = lambda score, group, traj, step, key: types.SimpleNamespace(  # noqa: E731
        episode_score=score, step_score=0.0, group_id=group, traj_id=traj, step=step, state_key=key,
        action_valid=True)
    samples = [S(1.0, "a", "t0", 0, "x"), S(1.0, "a", "t0", 1, "y"), S(0.5, "b", "t1", 0, "z")]
    arl_own = load_config("configs/tiny_frozenlake_gigpo.yaml").algo
    verl_agent = load_config("configs/tiny_frozenlake_gigpo.yaml", ["algo.singleton=raw"]).algo
    assert (arl_own.episode_stats, arl_own.singleton) == ("episodes", "zero")
    adv_own, _ = estimators.estimate("gigpo", samples, arl_own)
    adv_raw, _ = estimators.estimate("gigpo", samples, verl_agent)
    assert np.allclose(adv_own, 0.0)  # singletons give 0, and each anchor group is a singleton too
    assert np.allclose(adv_raw, [1.0, 1.0, 0.5])  # a singleton passes its raw score (mean 0, std 1)
    with pytest.raises(ValueError):
        load_config("configs/tiny_frozenlake_gigpo.yaml", ["algo.episode_stats=batch"])
