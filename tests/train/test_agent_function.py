"""An agent that is one async function in the user's own module, `async def agent(client, seed)`,
trains through proxy mode by its import path: no AgentRunner subclass, no arl import (issue 44 §4)."""

from __future__ import annotations

import pytest
from outside_arl import user_module
from trainer_support import params_of, scripted, small_config

from arl.agents.runner import EpisodeResult, FunctionRunner, as_episode_result
from arl.config import ConfigError, ManagerConfig, ProxyConfig
from arl.rollout import EpisodeSpec, ProxyEnvManager
from arl.rollout.runners import is_agent_function, make_runner_factory
from arl.train import Trainer

pytestmark = pytest.mark.anyio

AGENTS = '''
async def agent(client, seed):
    """One question per episode, scored 1 when the reply says Up: no class, no arl import."""
    reply = await client.chat.completions.create(
        model="whatever", messages=[{"role": "user", "content": f"Level {seed}. Which way? <answer>Up</answer>?"}])
    says_up = "Up" in (reply.choices[0].message.content or "")
    return {"score": float(says_up), "success": says_up}


async def with_context(client, seed, env_id, config, bonus=0.0):
    """Asks for the env id and the manager's config by naming them; bonus comes from runner_kwargs."""
    for _ in range(2):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": env_id}],
                                             max_tokens=config.max_tokens)
    return 0.25 + bonus


async def says_done(client, seed):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    return "done"


async def reports_validity(client, seed):
    """Two calls; it says the first action was invalid and the second valid."""
    for _ in range(2):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    return {"score": 1.0, "step_scores": [0.0, 1.0], "step_infos": [{"action_valid": False}, {"action_valid": True}]}


async def no_seed(client):
    return 1.0


def factory(client, spec, config):
    raise AssertionError("a factory is not called when the runner factory is made")
'''


def user_agents(tmp_path, monkeypatch) -> str:
    return user_module(tmp_path, monkeypatch, AGENTS, prefix="user_agents")


def spec(seed: int = 3) -> EpisodeSpec:
    return EpisodeSpec(env_id="arl/FrozenLake-v0", seed=seed, group_id="g", episode_id=0)


async def test_a_plain_async_function_trains_one_step_through_the_trainer(tmp_path, monkeypatch):
    mod = user_agents(tmp_path, monkeypatch)
    config = small_config(tmp_path, "rollout.mode=proxy", f"rollout.proxy.runner={mod}:agent", "steps=1")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.setup()
        before = params_of(trainer.model)
        batch = await trainer.groups.run(trainer.manager, trainer.groups.specs(0))
        history = await trainer.train()
        after = params_of(trainer.model)
    trajs = [e.trajectory for e in batch.episodes]
    assert len(trajs) == 8 and all(t.exit_reason == "terminated" and t.status == "Finished" for t in trajs), \
        [(t.exit_reason, t.error) for t in trajs]
    assert {t.episode_score for t in trajs} <= {0.0, 1.0} and all(t.success == (t.episode_score == 1.0) for t in trajs)
    # the function reports no steps: its one call's sample carries the episode's score, and no warning is due
    assert all(s.step_score == s.episode_score for e in batch.episodes for s in e.samples)
    assert all(t.turns[0].info["step_report"] == "unreported" for t in trajs)
    (row,) = [r for r in history if "rollout/num_episodes" in r]
    assert row["rollout/num_episodes"] == 8 and row["rollout/exit/agent_error"] == 0
    assert row["rollout/step_report_mismatch_rate"] == 0.0
    # nobody said whether an action was valid: no valid-action rate (it read 1.0, never measured)
    assert "rollout/valid_action_rate" not in row and all("action_valid" not in t.turns[0].info for t in trajs)
    assert any(not before[n].equal(after[n]) for n in before)  # it trained


async def test_an_agent_function_gets_env_id_config_and_runner_kwargs_by_name(tmp_path, monkeypatch):
    from arl.engine import make_engine

    mod = user_agents(tmp_path, monkeypatch)
    engine = make_engine(backend="scripted", model="tiny", max_model_len=1024)
    factory = make_runner_factory(ProxyConfig(runner=f"{mod}:with_context", runner_kwargs={"bonus": 0.5}))
    episode = await ProxyEnvManager(engine, ManagerConfig(max_tokens=4), factory,
                                    granularity="step").run_episode(spec())
    traj = episode.trajectory
    assert traj.exit_reason == "terminated" and traj.episode_score == 0.75 and len(traj.turns) == 2
    assert [s.step_score for s in episode.samples] == [0.75, 0.75]
    assert all(len(t.response_ids) <= 4 for t in traj.turns)  # config.max_tokens reached the agent by name
    assert "arl/FrozenLake-v0" in engine.tokenizer.decode(episode.samples[0].input_ids)  # so did env_id


async def test_what_an_agent_function_returns_that_is_no_result_ends_its_episode_as_agent_error(tmp_path, monkeypatch):
    from arl.engine import make_engine

    mod = user_agents(tmp_path, monkeypatch)
    engine = make_engine(backend="scripted", model="tiny", max_model_len=1024)
    factory = make_runner_factory(ProxyConfig(runner=f"{mod}:says_done"))
    traj = (await ProxyEnvManager(engine, ManagerConfig(max_tokens=4), factory).run_episode(spec())).trajectory
    assert traj.exit_reason == "agent_error" and "returns a score, a bool, a dict" in traj.error and "str" in traj.error


def test_a_function_that_cannot_take_the_call_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    mod = user_agents(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match=r"is called as agent\(client, seed\)"):
        make_runner_factory(ProxyConfig(runner=f"{mod}:no_seed"))
    with pytest.raises(ValueError, match=r"is called as agent\(client, seed, env_id=, config=, colour=\)"):
        make_runner_factory(ProxyConfig(runner=f"{mod}:with_context", runner_kwargs={"colour": "red"}))
    with pytest.raises(ValueError, match=r"is called as factory\(client, spec, config, window=\)"):
        make_runner_factory(ProxyConfig(runner=f"{mod}:factory", runner_kwargs={"window": 4}))
    config = small_config(tmp_path, "rollout.mode=proxy", f"rollout.proxy.runner={mod}:no_seed")
    with pytest.raises(ConfigError, match=r"@ rollout\.proxy\.runner"):
        Trainer(config)
    assert not (tmp_path / "t").exists()


def test_agent_functions_are_told_from_factories_by_being_async():
    import functools

    async def agent(client, seed):
        return 1.0

    class CallableAgent:
        async def __call__(self, client, seed):
            return 1.0

    def factory(client, spec, config):
        return FunctionRunner(client, agent)

    assert is_agent_function(agent) and is_agent_function(functools.partial(agent)) and is_agent_function(CallableAgent())
    assert not is_agent_function(factory) and not is_agent_function(CallableAgent) and not is_agent_function(FunctionRunner)


@pytest.mark.parametrize(("value", "score", "success"), [
    (0.5, 0.5, False), (2, 2.0, False), (True, 1.0, True), (False, 0.0, False),
    ({"score": 1.0, "success": True}, 1.0, True), (EpisodeResult(score=3.0, success=True), 3.0, True),
])
def test_an_agent_function_may_return_a_score_a_bool_a_dict_or_a_result(value, score, success):
    result = as_episode_result(value)
    assert (result.score, result.success, result.status) == (score, success, "Finished")
    for bad in ({"score": float("nan")}, {"sucess": True}, None, [1.0]):
        with pytest.raises((TypeError, ValueError)):
            as_episode_result(bad)


async def test_the_valid_action_rate_averages_only_the_steps_an_agent_reported(tmp_path, monkeypatch):
    from arl.engine import make_engine
    from arl.rollout.metrics import rollout_metrics

    mod = user_agents(tmp_path, monkeypatch)
    engine = make_engine(backend="scripted", model="tiny", max_model_len=1024)
    reporting = make_runner_factory(ProxyConfig(runner=f"{mod}:reports_validity"))
    silent = make_runner_factory(ProxyConfig(runner=f"{mod}:agent"))
    episodes = [await ProxyEnvManager(engine, ManagerConfig(max_tokens=4), f, granularity="step").run_episode(spec())
                for f in (reporting, silent)]
    assert [s.action_valid for s in episodes[0].samples] == [False, True]
    assert [s.action_valid for s in episodes[1].samples] == [True]  # unreported: no invalid penalty
    assert rollout_metrics(episodes)["rollout/valid_action_rate"] == 0.5  # the silent agent's step is not averaged in
