"""Every sample records how its tokens were drawn, and the trainer scores them at that (issue 43 item 1).

An agent in proxy mode may set temperature / top_p / top_k per request. The engine draws at what
the handler resolves (``agent_sampling``: honour the request, or override it with the config's
values), the sample records it (`SampledWith`, one per reply), and the trainer computes each
reply's log-probs at the temperature it was drawn at: so the trainer/engine log-prob gap of an agent
that asks for T=0.3 is as small as that of one that asks nothing.
"""

from __future__ import annotations

import logging

import attrs
import pytest
import torch

from arl.agents.gym_runner import GymRunner
from arl.config import ManagerConfig
from arl.engine import SampledWith, make_engine
from arl.engine.scripted import ScriptedEngine
from arl.intercept import InProcessClient
from arl.intercept.handler import ChatHandler, SamplingDefaults
from arl.intercept.tracker import MessageTracker
from arl.rollout import ProxyEnvManager, Sample, collate
from arl.rollout.records import sampling_counts
from arl.rollout.runners import gym_runner, make_runner_factory
from arl.rollout.scheduler import GroupScheduler
from arl.train import Trainer
from tests.train.trainer_support import small_config

pytestmark = pytest.mark.anyio


# -- the handler: what the request asked, what was drawn, what the sample records -------------------

async def _two_calls(tokenizer, defaults, first: dict, second: dict) -> tuple[MessageTracker, ChatHandler]:
    tracker = MessageTracker(tokenizer)
    handler = ChatHandler(ScriptedEngine(tokenizer), tracker, defaults=defaults)
    client = InProcessClient(handler, "ep")
    messages = [{"role": "user", "content": "hello"}]
    reply = await client.chat.completions.create(model="arl", messages=messages, max_tokens=4, **first)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": "again"}]
    await client.chat.completions.create(model="arl", messages=messages, max_tokens=4, **second)
    return tracker, handler


async def test_honoured_fields_are_recorded_per_reply_in_trajectory_and_step_samples(tiny_tokenizer):
    tracker, handler = await _two_calls(
        tiny_tokenizer, SamplingDefaults(temperature=1.0, agent_sampling="honour"),
        {"temperature": 0.3, "top_p": 0.9}, {})
    hot, plain = SampledWith(temperature=0.3, top_p=0.9), SampledWith(temperature=1.0)
    (traj,) = tracker.traj_samples()
    assert traj.sampled_with == (hot, plain)  # one record per reply, in order
    assert [s.sampled_with for s in tracker.step_samples()] == [(hot,), (plain,)]
    assert handler.stats["sampling_overrides"] == 0
    sample = Sample(traj.input_ids, traj.response_mask, traj.logprobs, 0.0, 0.0, "g", "g/0",
                    sampled_with=traj.sampled_with)
    temps = collate([sample])["temperatures"][0]
    mask = torch.tensor(traj.response_mask).bool()
    first_end = traj.response_mask.index(0, traj.response_mask.index(1))
    assert temps[: first_end][mask[: first_end]].tolist() == pytest.approx([0.3] * sum(traj.response_mask[:first_end]))
    assert set(temps[first_end:][mask[first_end:]].tolist()) == {1.0}
    assert set(temps[~mask].tolist()) == {1.0}
    counts = sampling_counts([sample])
    assert counts["sampling_truncated_tokens"] == sum(traj.response_mask[:first_end])
    assert counts["sampling_greedy_tokens"] == 0


async def test_override_draws_at_the_config_and_counts_each_field_it_changed(tiny_tokenizer):
    tracker, handler = await _two_calls(
        tiny_tokenizer, SamplingDefaults(temperature=0.7, agent_sampling="override"),
        {"temperature": 0.0, "top_k": 5}, {"temperature": 0.7})  # the second asks what the config says
    (traj,) = tracker.traj_samples()
    assert traj.sampled_with == (SampledWith(temperature=0.7),) * 2
    assert handler.stats["sampling_overrides"] == 2  # temperature and top_k of the first call


async def test_stop_strings_and_constraints_are_recorded(tiny_tokenizer):
    tracker, _ = await _two_calls(tiny_tokenizer, SamplingDefaults(), {"stop": ["e"]}, {})
    first = tracker.requests[0].sampled_with
    text = tiny_tokenizer.decode(tracker.requests[0].response_ids, skip_special_tokens=True)
    assert first.stopped_by_string == ("e" in text)
    assert not tracker.requests[1].sampled_with.stopped_by_string


def test_greedy_replies_are_scored_at_temperature_one_and_counted():
    sample = Sample([1, 2, 3], [0, 1, 1], [0.0, -0.1, -0.2], 0.0, 0.0, "g", "g/0",
                    sampled_with=[SampledWith(temperature=0.0)])
    assert collate([sample])["temperatures"][0].tolist() == [1.0, 1.0, 1.0]
    assert sampling_counts([sample])["sampling_greedy_tokens"] == 2.0


def test_a_sample_whose_records_do_not_match_its_replies_is_refused():
    with pytest.raises(ValueError, match="2 sampled_with records for 1 replies"):
        Sample([1, 2, 3], [0, 1, 1], [0.0] * 3, 0.0, 0.0, "g", "g/0",
               sampled_with=[SampledWith(), SampledWith()])


# -- the trainer: each sample scored at its own temperature -----------------------------------------

class _AsksItsOwn(GymRunner):
    """A gym agent with its framework's own sampling setting (LlamaIndex sends 0.1, many 0.7)."""

    asked: float | None = 0.3

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.temperature = self.asked  # None: the request carries no temperature


class _AsksNothing(_AsksItsOwn):
    asked = None


async def _one_step(tmp_path, runner_cls, *overrides) -> dict[str, float]:
    config = small_config(tmp_path, "steps=1", "engine.backend=hf", "rollout.mode=proxy",
                          "rollout.manager.max_turns=2", "optim.lr=1e-6", *overrides)
    engine = make_engine(backend="hf", model=config.model, max_model_len=1024, seed=0)
    manager = ProxyEnvManager(engine, config.rollout.manager, granularity="step",
                              runner_factory=make_runner_factory(gym_runner, runner_cls=runner_cls))
    async with Trainer(config, engine=engine, manager=manager) as trainer:
        await trainer.setup()
        return await trainer.step()


@pytest.mark.slow
async def test_an_agent_that_asks_its_own_temperature_trains_with_the_same_logprob_gap(tmp_path, caplog):
    honour = "rollout.manager.agent_sampling=honour"
    asked = await _one_step(tmp_path / "asked", _AsksItsOwn, honour)
    plain = await _one_step(tmp_path / "plain", _AsksNothing, honour)
    assert asked["train/sampling_temperature_mean"] == pytest.approx(0.3)
    assert plain["train/sampling_temperature_mean"] == pytest.approx(1.0)
    # the same model in fp32 on both sides: only numerics differ (scored at T=1, the 0.3 draws gave ~1e-1)
    assert asked["train/logprob_gap"] < 1e-4 and plain["train/logprob_gap"] < 1e-4
    assert asked["train/logprob_gap"] < 10 * plain["train/logprob_gap"] + 1e-5
    assert asked["train/sampling_overridden_fields"] == 0

    with caplog.at_level(logging.WARNING, logger="arl.train.trainer"):
        overridden = await _one_step(tmp_path / "override", _AsksItsOwn)  # the default policy
    assert overridden["train/sampling_overridden_fields"] > 0
    assert overridden["train/sampling_temperature_mean"] == pytest.approx(1.0)
    assert overridden["train/logprob_gap"] < 1e-4
    assert sum("agent_sampling=override" in r.getMessage() for r in caplog.records) == 1


def test_the_default_policy_is_override():
    assert ManagerConfig().agent_sampling == "override"
    with pytest.raises(ValueError):
        attrs.evolve(ManagerConfig(), agent_sampling="ignore")


async def test_validation_derives_keep_the_policy(tiny_tokenizer):
    config = ManagerConfig(agent_sampling="honour", max_turns=1)
    manager = ProxyEnvManager(ScriptedEngine(tiny_tokenizer), config, granularity="step",
                              runner_factory=make_runner_factory(gym_runner, runner_cls=_AsksItsOwn))
    val = manager.derive(attrs.evolve(config, temperature=0.5))
    async with val:
        scheduler = GroupScheduler("arl/FrozenLake-v0", num_groups=1, group_size=1)
        batch = await scheduler.run(val, scheduler.specs(0))
    assert {s.sampled_with[0].temperature for s in batch.samples} == {0.3}
