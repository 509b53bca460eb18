"""Names moved by the reorganisation still import from their old place, with a DeprecationWarning."""

import attrs
import pytest

from arl.config import KeepBranches


@pytest.mark.parametrize("module", ["arl.intercept.tracker", "arl.rollout.proxy"])
def test_keep_is_keep_branches_and_deprecated(module):
    mod = __import__(module, fromlist=["Keep"])
    with pytest.warns(DeprecationWarning, match="KeepBranches"):
        assert mod.Keep is KeepBranches
    with pytest.raises(AttributeError):
        mod.NoSuchName  # noqa: B018


def test_renamed_config_keys_still_load_with_a_warning():
    """`algo.gigpo_mode` is `algo.gigpo_norm`, `rollout.proxy.tracker_mode` is `rollout.proxy.granularity`
    (docs/architecture.md, "Glossary"): an old YAML or override loads, warns, and means the same."""
    from arl.config import ConfigError, load_config, structure

    with pytest.warns(DeprecationWarning) as caught:
        config = load_config(None, ["algo.gigpo_mode=mean_std_norm", "rollout.proxy.tracker_mode=traj"])
    assert {"gigpo_norm", "granularity"} <= {word for w in caught for word in ("gigpo_norm", "granularity") if word in str(w.message)}
    assert (config.algo.gigpo_norm, config.rollout.proxy.granularity) == ("mean_std_norm", "traj")
    with pytest.warns(DeprecationWarning, match="gigpo_norm"):
        assert config.algo.gigpo_mode == "mean_std_norm"  # an estimator of a user's may read the old field
    with pytest.warns(DeprecationWarning, match="granularity"):
        assert config.rollout.proxy.tracker_mode == "traj"
    with pytest.raises(ConfigError, match="give only algo.gigpo_norm"):  # one mapping with both names
        structure({"algo": {"gigpo_mode": "mean_norm", "gigpo_norm": "mean_norm"}})
    # an old key in a file or an override meets the new one of a packaged config (a base) as its rename
    with pytest.warns(DeprecationWarning, match="gigpo_norm"):
        assert load_config("tiny_frozenlake_gigpo", ["algo.gigpo_mode=mean_std_norm"]).algo.gigpo_norm == "mean_std_norm"


def test_tracker_mode_keyword_and_type_are_granularity(tiny_tokenizer):
    import arl.config
    from arl.config import Granularity
    from arl.engine.scripted import ScriptedEngine
    from arl.rollout.proxy import ProxyEnvManager

    with pytest.warns(DeprecationWarning, match="Granularity"):
        assert arl.config.TrackerMode is Granularity
    with pytest.warns(DeprecationWarning, match="granularity"):
        manager = ProxyEnvManager(ScriptedEngine(tiny_tokenizer), tracker_mode="traj")
    assert manager.granularity == "traj" and manager.mode == "proxy-traj"
    with pytest.warns(DeprecationWarning, match="granularity"):
        assert manager.tracker_mode == "traj"


# -- the state key and the scores (issue 44 §1; docs/architecture.md, "Glossary") ----------------


def _sample(**fields):
    from arl.rollout.records import Sample

    return Sample(**{"input_ids": [1, 2], "response_mask": [0, 1], "old_logprobs": [0.0, -1.0], "episode_score": 1.0,
                     "step_score": 0.5, "group_id": "g", "traj_id": "g/0", **fields})


def test_sample_state_hash_and_score_are_state_key_and_step_score():
    """`Sample.state_hash` is `state_key`; `Sample.score`, a copy of `step_score`, is removed:
    both still work as keywords and read-only attributes, with a warning naming the new name."""
    from arl.rollout.records import Sample

    with pytest.warns(DeprecationWarning, match=r"Sample\(\w+=\.\.\.\) is deprecated") as caught:
        old = _sample(state_hash="k", score=0.5)
    assert {str(w.message) for w in caught} == {"Sample(state_hash=...) is deprecated: use Sample(state_key=...)",
                                                "Sample(score=...) is deprecated: use Sample(step_score=...)"}
    assert old == _sample(state_key="k")
    with pytest.warns(DeprecationWarning, match=r"Sample\.state_key"):
        assert old.state_hash == "k"
    with pytest.warns(DeprecationWarning, match=r"Sample\.step_score"):
        assert old.score == 0.5
    with pytest.raises(TypeError, match="give only step_score"), pytest.warns(DeprecationWarning):
        _sample(score=0.25)  # a score that is not the step score
    # the positional layout of before: (input_ids, response_mask, old_logprobs, score, episode_score, ...)
    with pytest.warns(DeprecationWarning, match="score, a copy of step_score, is removed"):
        positional = Sample([1, 2], [0, 1], [0.0, -1.0], 0.5, 1.0, 0.5, "g", "g/0", 0, "k")
    assert positional == old
    with pytest.warns(DeprecationWarning, match="score, a copy of step_score, is removed"):
        assert Sample([1, 2], [0, 1], [0.0, -1.0], 0.5, episode_score=1.0, step_score=0.5, group_id="g",
                      traj_id="g/0", state_key="k") == old
    assert Sample([1, 2], [0, 1], [0.0, -1.0], 1.0, 0.5, "g", "g/0", 0, "k") == old  # today's: no warning


def test_sample_of_takes_its_old_keywords():
    from arl.engine.tokens import TokenRow
    from arl.rollout.records import EpisodeSpec, Sample, Trajectory

    spec, traj = EpisodeSpec("arl/FrozenLake-v0", 0, "g", 0), Trajectory("arl/FrozenLake-v0", "g", 0, 0)
    row = TokenRow.whole([1, 2], [0, 1], [0.0, -1.0])
    new = Sample.of(spec, traj, row, mode="step", step_score=0.5, state_key="k", action_valid=True, policy_version=0)
    with pytest.warns(DeprecationWarning, match=r"Sample\.of\((step_score|state_key)="):
        old = Sample.of(spec, traj, row, mode="step", score=0.5, state_hash="k", action_valid=True, policy_version=0)
    assert old == new and (new.step_score, new.state_key) == (0.5, "k")


def test_collate_scores_are_the_step_scores_and_its_keys_state_keys():
    from arl.rollout.records import collate

    batch = collate([_sample(state_key="k")])
    assert batch["scores"].tolist() == batch["step_scores"].tolist() == [0.5]
    assert batch["token_scores"][0, 1] == 0.5 and batch["state_keys"] == ["k"]


def test_turn_and_tracked_sample_state_hash_is_state_key():
    from arl.intercept.tracker import TrackedSample
    from arl.rollout.records import Turn

    with pytest.warns(DeprecationWarning, match=r"Turn\(state_key="):
        turn = Turn("o", [1], [2], [0.0], state_hash="k")
    assert turn.state_key == "k"
    with pytest.warns(DeprecationWarning, match=r"Turn\.state_key"):
        assert turn.state_hash == "k"
    tracked = TrackedSample([1, 2], [0, 1], [0.0, -1.0], (0,), 0, "k", "o", 0, "stop")
    with pytest.warns(DeprecationWarning, match=r"TrackedSample\.state_key"):
        assert tracked.state_hash == "k"


def test_step_report_state_is_observation_and_the_wire_format_is_unchanged():
    from arl.agents.runner import StepReport

    with pytest.warns(DeprecationWarning, match=r"StepReport\(observation="):
        report = StepReport(reward=1.0, state="P_G", state_key="#k")
    assert report == StepReport(1.0, "P_G", state_key="#k") and report.observation == "P_G"
    with pytest.warns(DeprecationWarning, match=r"StepReport\.observation"):
        assert report.state == "P_G"
    assert report.to_info() == {"state": "P_G", "state_key": "#k"}  # what agents write (validity: not said)
    assert attrs.evolve(report, action_valid=True).to_info()["action_valid"] is True


@pytest.mark.parametrize("module", ["arl.agents", "arl.agents.runner"])
def test_state_key_constants_are_the_info_keys(module):
    import importlib

    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match="OBSERVATION_INFO_KEY"):
        assert mod.STATE_KEY == mod.OBSERVATION_INFO_KEY == "state"
    with pytest.warns(DeprecationWarning, match="STATE_KEY_INFO_KEY"):
        assert mod.GAME_STATE_KEY == mod.STATE_KEY_INFO_KEY == "state_key"
    with pytest.raises(AttributeError):
        mod.NoSuchName  # noqa: B018


def test_the_estimators_take_state_hashes_as_state_keys():
    import numpy as np

    from arl.algo import gigpo, gigpo_forked, step_advantages

    columns = ([1, 1, 0, 0], [0, 1, 0, 0], ["g"] * 4, ["A", "A", "B", "B"], [0, 1, 0, 1])
    keys = ["s0", "s1", "s0", "s0"]
    want, _ = gigpo(*columns, keys, gamma=0.5)
    with pytest.warns(DeprecationWarning, match=r"gigpo\(state_keys="):
        np.testing.assert_array_equal(gigpo(*columns, state_hashes=keys, gamma=0.5)[0], want)
    with pytest.warns(DeprecationWarning, match=r"step_advantages\(state_keys="):
        a_s, _ = step_advantages([0.5, 1.0, 0.0, 0.0], ["g"] * 4, state_hashes=keys)
    np.testing.assert_array_equal(a_s, step_advantages([0.5, 1.0, 0.0, 0.0], ["g"] * 4, keys)[0])
    forks = dict(fork_ids=[None] * 4, fork_rewards=[()] * 4, branch=[False] * 4, gamma=0.5)
    with pytest.warns(DeprecationWarning, match=r"gigpo_forked\(state_keys="):
        np.testing.assert_array_equal(gigpo_forked(*columns, state_hashes=keys, **forks)[0], want)
    with pytest.raises(TypeError, match="give only state_keys"), pytest.warns(DeprecationWarning):
        gigpo(*columns, state_keys=keys, state_hashes=keys)


def test_the_gigpo_estimators_take_mode_as_norm():
    """GiGPO's normalisation is its norm (docs/architecture.md, "Glossary"; `algo.gigpo_norm`): the
    old keyword ``mode=`` still works, with a warning naming ``norm=``, and means the same."""
    import numpy as np

    from arl.algo import episode_advantages, gigpo, gigpo_forked, step_advantages

    columns = ([1, 1, 0, 0], [0, 1, 0, 0], ["g"] * 4, ["A", "A", "B", "B"], [0, 1, 0, 1], ["s0", "s1", "s0", "s0"])
    want, _ = gigpo(*columns, gamma=0.5, norm="mean_std_norm")
    with pytest.warns(DeprecationWarning, match=r"gigpo\(mode=\.\.\.\) is deprecated: use gigpo\(norm="):
        np.testing.assert_array_equal(gigpo(*columns, gamma=0.5, mode="mean_std_norm")[0], want)
    forks = dict(fork_ids=[None] * 4, fork_rewards=[()] * 4, branch=[False] * 4, gamma=0.5)
    with pytest.warns(DeprecationWarning, match=r"gigpo_forked\(norm="):
        np.testing.assert_array_equal(gigpo_forked(*columns, mode="mean_std_norm", **forks)[0], want)
    returns, keys = [0.5, 1.0, 0.0, 0.0], ["g"] * 4
    with pytest.warns(DeprecationWarning, match=r"step_advantages\(norm="):
        a_s, _ = step_advantages(returns, keys, columns[5], mode="mean_std_norm")
    np.testing.assert_array_equal(a_s, step_advantages(returns, keys, columns[5], norm="mean_std_norm")[0])
    with pytest.warns(DeprecationWarning, match=r"episode_advantages\(norm="):
        a_e, _ = episode_advantages(columns[0], keys, columns[3], mode="mean_std_norm")
    np.testing.assert_array_equal(a_e, episode_advantages(columns[0], keys, columns[3], norm="mean_std_norm")[0])
    with pytest.raises(TypeError, match="give only norm"), pytest.warns(DeprecationWarning):
        gigpo(*columns, norm="mean_norm", mode="mean_std_norm")
    with pytest.raises(ValueError, match="unknown norm"), pytest.warns(DeprecationWarning):
        gigpo(*columns, mode="std")  # the old keyword, checked as the new one


def test_an_estimator_reading_state_hash_still_works():
    """A user's estimator written against `Sample.state_hash`, and sample-like rows that carry only
    `state_hash`, give what they gave, with a warning."""
    import types

    import numpy as np

    from arl.algo.estimators import estimate, register

    def by_state(samples, settings):
        return np.array([1.0 if s.state_hash == "s0" else 0.0 for s in samples]), {}

    register("test_deprecated_names:by_state", by_state)
    samples = [_sample(traj_id=f"g/{i}", step=0, state_key=k) for i, k in enumerate(["s0", "s1", "s0"])]
    with pytest.warns(DeprecationWarning, match=r"Sample\.state_key"):
        adv, _ = estimate("test_deprecated_names:by_state", samples, types.SimpleNamespace())
    assert adv.tolist() == [1.0, 0.0, 1.0]
    settings = types.SimpleNamespace(gamma=0.5, step_weight=1.0, gigpo_norm="mean_norm")
    want, _ = estimate("gigpo", samples, settings)
    rows = [types.SimpleNamespace(**{k: getattr(s, k) for k in ("episode_score", "step_score", "group_id", "traj_id",
                                                                   "step", "action_valid")}, state_hash=s.state_key)
            for s in samples]
    with pytest.warns(DeprecationWarning, match="state_hash is deprecated: use state_key"):
        got, _ = estimate("gigpo", rows, settings)
    np.testing.assert_array_equal(got, want)


# -- how an agent's runner is made, and the two Branch classes (issue 44 §1) ------------------------


@pytest.mark.parametrize(("module", "old", "new"), [
    ("arl.rollout.runners", "RUNNERS", "RUNNER_FACTORIES"),
    ("arl.rollout.runners", "resolve_runner", "load_runner"),
    ("arl.rollout.factory", "RUNNERS", "RUNNER_FACTORIES"),
    ("arl.rollout.factory", "resolve_runner", "load_runner"),
])
def test_renamed_runner_names_are_the_new_ones(module, old, new):
    import importlib

    from arl.rollout import runners

    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=new):
        assert getattr(mod, old) is getattr(runners, new)
    with pytest.raises(AttributeError):
        mod.NoSuchName  # noqa: B018


@pytest.mark.parametrize(("module", "new"), [
    ("arl.rollout", "ForkBranch"), ("arl.rollout.records", "ForkBranch"), ("arl.intercept.tracker", "ConversationBranch"),
])
def test_branch_is_fork_branch_or_conversation_branch(module, new):
    import importlib

    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=new):
        assert mod.Branch is getattr(mod, new)


def _factory_spec():
    from arl.rollout.base import EpisodeSpec

    return EpisodeSpec("arl/FrozenLake-v0", 3, "g", 0)


def test_the_old_binders_still_make_runners_bound_to_a_config():
    """`bind_runner`, `runner_binder` (config -> (client, spec) -> runner) and `agent_function_runner`
    are `make_runner_factory` now, whose factory the manager calls with its config."""
    from arl.agents.runner import FunctionRunner
    from arl.config import ManagerConfig, ProxyConfig
    from arl.rollout import runners

    config = ManagerConfig(max_tokens=7)
    with pytest.warns(DeprecationWarning, match=r"make_runner_factory\(factory"):
        bind_runner = runners.bind_runner
    runner = bind_runner(runners.gym_runner, history_len=3)(config)("client", _factory_spec())
    assert runner.max_tokens == 7 and runner.history_len == 3
    with pytest.warns(DeprecationWarning, match=r"make_runner_factory\(proxy_config"):
        runner_binder = runners.runner_binder
    assert runner_binder(ProxyConfig())(config)("client", _factory_spec()).max_tokens == 7
    with pytest.raises(ValueError, match="runner_kwargs.command"):
        runner_binder(ProxyConfig(runner="pull"))
    with pytest.warns(DeprecationWarning, match="RunnerFactory"):
        assert runners.RunnerBinder is not None

    async def agent(client, seed, config):
        return float(config.max_tokens)

    with pytest.warns(DeprecationWarning, match=r"make_runner_factory\(fn"):
        factory = runners.agent_function_runner(agent)
    assert isinstance(factory("client", _factory_spec(), config), FunctionRunner)


@pytest.mark.anyio
async def test_the_old_ways_to_give_proxy_env_manager_its_agent_still_work(tiny_tokenizer):
    """``runner_for=`` (a config -> factory binder), a factory of ``(client, spec)`` and
    `gym_runner_factory` each still run episodes, with a warning naming what replaces them."""
    import attrs

    from arl.agents.gym_runner import GymRunner
    from arl.config import ManagerConfig
    from arl.engine.scripted import ScriptedEngine
    from arl.rollout import proxy
    from arl.rollout.proxy import ProxyEnvManager
    from arl.rollout.runners import gym_runner

    engine, config = ScriptedEngine(tiny_tokenizer), ManagerConfig(max_tokens=8, max_turns=1)
    seen = []

    def binder(cfg):
        seen.append(cfg.temperature)
        return lambda client, spec: gym_runner(client, spec, cfg)

    with pytest.warns(DeprecationWarning, match="runner_for"):
        manager = ProxyEnvManager(engine, config, runner_for=binder)
    val = manager.derive(attrs.evolve(config, temperature=0.5))  # the binder's config is the derived one
    for m in (manager, val):
        assert (await m.run_episode(_factory_spec())).trajectory.ok
    assert seen == [config.temperature, 0.5]
    with pytest.raises(ValueError, match="not both"):
        ProxyEnvManager(engine, config, gym_runner, runner_for=binder)

    with pytest.warns(DeprecationWarning, match=r"\(client, spec, config\)"):
        two = ProxyEnvManager(engine, config, lambda client, spec, cls=GymRunner: cls(client, spec.env_id, max_turns=1))
    assert (await two.run_episode(_factory_spec())).trajectory.ok

    with pytest.warns(DeprecationWarning, match="make_runner_factory"):
        gym_runner_factory = proxy.gym_runner_factory
    bound = gym_runner_factory(ManagerConfig(max_tokens=5))
    assert bound("client", _factory_spec()).max_tokens == 5  # bound to its own config, as before
    with pytest.warns(DeprecationWarning, match=r"\(client, spec, config\)"):
        old = ProxyEnvManager(engine, config, bound)
    assert (await old.run_episode(_factory_spec())).trajectory.ok


def test_an_old_key_in_a_base_meets_the_new_key_in_its_child(tmp_path):
    from arl.config import load_config

    (tmp_path / "a.yaml").write_text("algo: {gigpo_mode: mean_std_norm, gamma: 0.5}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nalgo: {gigpo_norm: mean_norm}\n")
    with pytest.warns(DeprecationWarning, match="gigpo_norm"):
        config = load_config(tmp_path / "b.yaml")
    assert (config.algo.gigpo_norm, config.algo.gamma) == ("mean_norm", 0.5)
