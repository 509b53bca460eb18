"""arl.algo.estimators: the one table from algo.estimator names to advantage functions, which the
trainer, benchmarks/credit.py and notebook 02 all call."""

from __future__ import annotations

import doctest

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
    return [Sample(input_ids=[1, 2], response_mask=[0, 1], old_logprobs=[0, -1], score=step_score,
                   episode_score=ep, step_score=step_score, group_id="g", traj_id=traj, step=step, state_hash=h)
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
                                 [s.state_hash for s in samples], gamma=algo.gamma, step_weight=algo.step_weight,
                                 mode=algo.gigpo_mode)
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
