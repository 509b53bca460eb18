"""Names moved by the reorganisation still import from their old place, with a DeprecationWarning."""

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
    from arl.config import ConfigError, load_config

    with pytest.warns(DeprecationWarning, match="gigpo_norm") as caught:
        config = load_config(None, ["algo.gigpo_mode=mean_std_norm", "rollout.proxy.tracker_mode=traj"])
    assert any("granularity" in str(w.message) for w in caught)
    assert (config.algo.gigpo_norm, config.rollout.proxy.granularity) == ("mean_std_norm", "traj")
    with pytest.warns(DeprecationWarning, match="gigpo_norm"):
        assert config.algo.gigpo_mode == "mean_std_norm"  # an estimator of a user's may read the old field
    with pytest.warns(DeprecationWarning, match="granularity"):
        assert config.rollout.proxy.tracker_mode == "traj"
    with pytest.raises(ConfigError, match="give only algo.gigpo_norm"):
        load_config(None, ["algo.gigpo_mode=mean_norm", "algo.gigpo_norm=mean_norm"])


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
