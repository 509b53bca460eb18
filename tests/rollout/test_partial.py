"""Partial rollouts (arl/rollout/partial.py): unfinished groups carried over an update intact, the
engine's requests stopped and drained at the update, resumed under the new weights, max_age drops
counted, a checkpoint's state, and the KV of a resumed episode after a weight push."""

from __future__ import annotations

import asyncio

import pytest

from arl.config import ManagerConfig
from arl.engine import make_engine
from arl.engine.base import EngineUnsupportedError
from arl.rollout import TrajEnvManager
from arl.rollout.factory import make_scheduler
from arl.rollout.partial import PartialScheduler

pytestmark = pytest.mark.anyio


class Held(TrajEnvManager):
    """Episodes ``(group serial, member)`` in ``hold`` wait after their first env step until their
    event is set (a slow env step that does not block the loop); every trajectory is kept."""

    def __init__(self, *args, hold=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.hold = {key: asyncio.Event() for key in hold}
        self.trajs = {}
        self.cancelled = []

    async def act(self, spec, traj, env, prompt_ids, observation):
        key = (int(spec.group_id.split("_")[1]), spec.episode_id)
        self.trajs[key] = traj
        out = await super().act(spec, traj, env, prompt_ids, observation)
        if key in self.hold and len(traj.turns) == 1:
            try:
                await self.hold[key].wait()
            except asyncio.CancelledError:
                self.cancelled.append(key)
                raise
        return out


def _scripted(**kwargs):
    # every reply is an invalid action: no episode ends before its turn limit, so a held one always resumes
    return make_engine(backend="scripted", model="tiny", scripted={"invalid_rate": 1.0, **kwargs})


async def _until(predicate, timeout=20.0):
    async def wait():
        while not predicate():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(wait(), timeout)


async def test_unfinished_group_is_carried_over_intact_and_resumes_under_the_new_weights(tiny_path):
    engine = _scripted()
    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=2, group_size=2, carry_over_groups=1, max_age=2)
    manager = Held(engine, ManagerConfig(max_tokens=16, max_turns=3), hold={(1, 0)})
    try:
        batch = await sched.collect(manager, 0)
        # groups 0 and 2 finished; group 1 (one member held) is carried, not waited for or dropped
        assert list(batch.groups) == ["train_0_0", "train_2_2"] and len(batch.samples) == 4
        m = batch.metrics
        assert m["rollout/partial_carried_groups"] == 1 and m["rollout/partial_carried_episodes"] == 1
        assert m["rollout/partial_age_max"] == 0 and m["rollout/partial_dropped_groups"] == 0
        assert m["rollout/tokens_lag_0"] == sum(len(t.response_ids) for e in batch.episodes for t in e.trajectory.turns)
        held = manager.trajs[(1, 0)]
        assert len(held.turns) == 1 and held.turns[0].policy_version == 0
        before = [(list(t.response_ids), list(t.response_logprobs)) for t in held.turns]

        # the update: the gate is closed, so the released episode's next request waits for the push
        manager.hold[(1, 0)].set()
        await _until(lambda: sched.gate.held >= 1)
        requests = engine.requests
        await asyncio.sleep(0.1)
        assert engine.requests == requests and len(held.turns) == 1 and not sched.gate.is_open
        await engine.update_weights([])  # the push: policy version 1
        sched.resume()
        await _until(lambda: all(t.done() for t in sched._live["train_1_1"].tasks))

        batch = await sched.collect(manager, 1)
        assert "train_1_1" in batch.groups  # the oldest finished group trains first
        episode = batch.groups["train_1_1"][0]
        turns = episode.trajectory.turns
        assert episode.trajectory is held and len(turns) == 3
        assert [t.policy_version for t in turns] == [0, 1, 1]  # the resumed turns: the new policy
        assert [(list(t.response_ids), list(t.response_logprobs)) for t in turns[:1]] == before  # intact
        sample = episode.samples[0]
        assert sample.policy_version == 0  # its oldest token's
        # the behaviour log-probs of every turn, old and new, are the sample's (what the IS weight divides by)
        assert [lp for lp, on in zip(sample.old_logprobs, sample.response_mask, strict=True) if on] == \
            [lp for t in turns for lp in t.response_logprobs]
        m = batch.metrics
        assert m["rollout/partial_age_max"] == 1 and m["rollout/partial_age_mean"] == pytest.approx(0.5)
        # sampled by version 0: the held member's first turn, and all of its sibling (it finished in step 0)
        sibling = batch.groups["train_1_1"][1].trajectory.turns
        assert [t.policy_version for t in sibling] == [0] * len(sibling)
        assert m["rollout/tokens_lag_1"] == len(turns[0].response_ids) + sum(len(t.response_ids) for t in sibling)
        assert m["rollout/tokens_lag_0"] + m["rollout/tokens_lag_1"] == sum(
            len(t.response_ids) for e in batch.episodes for t in e.trajectory.turns)
        # the other group of this step is one launched in step 1 (3 and 4 were launched to refill)
        assert sched.next_group == 5 and set(batch.groups) - {"train_1_1"} <= {"train_3_3", "train_4_4"}
    finally:
        await sched.aclose()
        await engine.close()


async def test_update_drains_running_requests_and_lets_none_start(tiny_path):
    """The request running at the update finishes (drained, not aborted), and none starts until `resume`.

    Group 0 plays one turn (0.0-0.2 s); group 1 starts at 0.1 s, so its first request is running
    (until 0.3 s) when group 0 finishes and the update begins."""
    engine = _scripted(latency_s=0.2)

    class Staggered(Held):
        async def run_episode(self, spec):
            if spec.group_id == "train_1_1":
                await asyncio.sleep(0.1)
            return await super().run_episode(spec)

        def start_episode(self, spec, traj):
            env, obs, limit = super().start_episode(spec, traj)
            return env, obs, 1 if spec.group_id == "train_0_0" else 3

    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=1, group_size=1, carry_over_groups=1, max_age=3)
    manager = Staggered(engine, ManagerConfig(max_tokens=16))
    try:
        batch = await sched.collect(manager, 0)
        assert list(batch.groups) == ["train_0_0"]
        assert batch.metrics["rollout/partial_drained_requests"] == 1 and sched.gate.in_flight == 0
        carried = manager.trajs[(1, 0)]
        assert len(carried.turns) == 1 and carried.turns[0].finish_reason != "abort"  # it finished its reply
        await _until(lambda: sched.gate.held == 1)  # its next request waits at the gate
        await asyncio.sleep(0.3)
        assert engine.requests == 2 and len(carried.turns) == 1  # none reached the engine during the update
        sched.resume()
        await _until(lambda: engine.requests > 2)
    finally:
        await sched.aclose()
        await engine.close()


async def test_the_time_an_episode_waits_out_an_update_is_not_its_timeout(tiny_path):
    """episode_timeout_s 4 s; the carried episode waits 5 s at the closed gate (a long update)
    and still finishes: the wait stopped its clock, it did not time it out (4 s leaves the
    episode's own turns room on a loaded machine)."""
    engine = _scripted()
    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=2, group_size=2, carry_over_groups=1, max_age=2)
    manager = Held(engine, ManagerConfig(max_tokens=16, max_turns=3, episode_timeout_s=4.0), hold={(1, 0)})
    try:
        await sched.collect(manager, 0)
        manager.hold[(1, 0)].set()
        await _until(lambda: sched.gate.held == 1)
        await asyncio.sleep(5.0)  # the update
        sched.resume()
        batch = await sched.collect(manager, 1)
        held = batch.groups["train_1_1"][0].trajectory
        assert (held.status, held.exit_reason, len(held.turns)) == ("Finished", "truncated", 3)
        assert held.timings["paused"] >= 5.0
    finally:
        await sched.aclose()
        await engine.close()


async def test_groups_past_max_age_are_dropped_and_counted(tiny_path):
    engine = _scripted()
    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=2, group_size=2, carry_over_groups=1, max_age=0)
    manager = Held(engine, ManagerConfig(max_tokens=16, max_turns=3), hold={(1, 0)})
    try:
        batch = await sched.collect(manager, 0)
        m = batch.metrics
        assert m["rollout/partial_dropped_groups"] == 1 and m["rollout/partial_dropped_episodes"] == 2
        dropped_tokens = sum(len(t.response_ids) for k in ((1, 0), (1, 1)) for t in manager.trajs[k].turns)
        assert m["rollout/partial_dropped_tokens"] == dropped_tokens > 0
        assert manager.cancelled == [(1, 0)] and sched.in_flight == [] and m["rollout/partial_carried_groups"] == 0
    finally:
        await sched.aclose()
        await engine.close()


async def test_state_restores_the_seed_stream_and_counts_what_it_drops(tiny_path):
    engine = _scripted()
    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=2, group_size=2, carry_over_groups=1, max_age=2)
    manager = Held(engine, ManagerConfig(max_tokens=16, max_turns=3), hold={(1, 0)})
    try:
        await sched.collect(manager, 0)
        state = sched.state()
        assert state == {"next_group": 3, "carried_groups": 1, "carried_episodes": 1}
    finally:
        await sched.aclose()
    resumed = PartialScheduler("arl/FrozenLake-v0", num_groups=2, group_size=2, carry_over_groups=1, max_age=2)
    resumed.restore(state)
    manager = Held(engine, ManagerConfig(max_tokens=16, max_turns=3))
    try:
        batch = await resumed.collect(manager, 1)
        # new groups after the checkpoint's: no level repeats, the carried group is not replayed
        assert all(int(g.split("_")[1]) >= 3 for g in batch.groups)
        assert batch.metrics["rollout/partial_dropped_on_resume"] == 1
    finally:
        await resumed.aclose()
        await engine.close()


def test_factory_builds_it_only_when_enabled():
    from arl.config import load_config

    plain = load_config(None, [])
    assert not plain.rollout.partial.enabled and type(make_scheduler(plain.rollout)) is not PartialScheduler
    on = load_config(None, ["rollout.partial.enabled=true", "rollout.partial.carry_over_groups=3",
                            "rollout.partial.max_age=2"])
    sched = make_scheduler(on.rollout)
    assert isinstance(sched, PartialScheduler) and (sched.carry_over_groups, sched.max_age) == (3, 2)
    with pytest.raises(TypeError, match="collect"):
        sched.specs(0)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.spare_groups=1"], "spare_groups"),
    (["rollout.max_staleness=1"], "max_staleness"),
    (["algo.is_cap=null"], "is_cap"),
    (["rollout.partial.kv=keep", "lora.rank=4"], "LoRA"),
    (["rollout.partial.kv=bogus"], "kv"),
])
def test_config_refuses_what_partial_rollouts_cannot_do(overrides, message):
    from arl.config import ConfigError, load_config

    with pytest.raises((ConfigError, ValueError), match=message):
        load_config(None, ["rollout.partial.enabled=true", *overrides])


async def test_keep_kv_is_refused_by_an_engine_without_a_prefix_cache(tiny_path):
    """keep on an engine that recomputes every prompt anyway would be a silent no-op: refused."""
    engine = _scripted()
    try:
        with pytest.raises(EngineUnsupportedError, match="no KV"):
            await engine.update_weights([], keep_kv=True)
        assert engine.policy_version == 0
    finally:
        await engine.close()


def _scores(model, prompt, response, temperature=1.0):
    """Log-probs of ``response`` after ``prompt`` under ``model`` (a fresh forward over both)."""
    import torch

    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


async def _resumed_turn(engine, push):
    """Play group 1's member across an update whose weight push is ``push()``; return its turns and
    the prefix-cache hits (prompt tokens) of its resumed request (None where the engine keeps no stats)."""
    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=1, group_size=1, carry_over_groups=1, max_age=2)
    manager = Held(engine, ManagerConfig(max_tokens=8, max_turns=2, temperature=1.0), hold={(1, 0)})
    try:
        await sched.collect(manager, 0)
        await push()
        before = engine.engine_stats()
        manager.hold[(1, 0)].set()
        sched.resume()  # the resumed request is the only one until the next collect launches new groups
        await _until(lambda: all(t.done() for t in sched._live["train_1_1"].tasks))
        after = engine.engine_stats()
        batch = await sched.collect(manager, 1)
        hits = None if before is None else after["prefix_cache_hits"] - before["prefix_cache_hits"]
        return batch.groups["train_1_1"][0].trajectory.turns, hits
    finally:
        await sched.aclose()


def _perturbed(tiny_path):
    """The tiny model (the old policy) and a copy with noise on every weight (the new one)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    old = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    new = copy.deepcopy(old)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return old, new


async def test_recompute_scores_the_resumed_prompt_with_the_new_weights(tiny_path):
    """kv: recompute (the HF engine's only way): the resumed turn's log-probs are those of a fresh
    forward over its whole prompt, old turns included, under the NEW weights, not the old ones."""
    import torch

    old, new = _perturbed(tiny_path)
    engine = make_engine(backend="hf", model="tiny", max_model_len=2048)
    try:
        (first, resumed), _ = await _resumed_turn(engine, lambda: engine.update_weights(list(new.state_dict().items())))
        assert (first.policy_version, resumed.policy_version) == (0, 1)
        assert torch.allclose(torch.tensor(first.response_logprobs), _scores(old, first.prompt_ids, first.response_ids),
                              atol=1e-3)
        engine_lp = torch.tensor(resumed.response_logprobs)
        assert len(resumed.prompt_ids) > len(first.prompt_ids) + len(first.response_ids)  # it extends the old turn
        assert torch.allclose(engine_lp, _scores(new, resumed.prompt_ids, resumed.response_ids), atol=1e-3)
        assert not torch.allclose(engine_lp, _scores(old, resumed.prompt_ids, resumed.response_ids), atol=1e-2)
    finally:
        await engine.close()


def _kept_scores(old, new, prompt, response, kept):
    """Log-probs of ``response`` when the first ``kept`` prompt tokens' KV comes from ``old`` (kept
    from before the push) and everything after is computed by ``new``."""
    import torch

    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        past = old(input_ids=ids[:, :kept], use_cache=True).past_key_values
        positions = torch.arange(kept, ids.shape[1])[None]
        logits = new(input_ids=ids[:, kept:], past_key_values=past, position_ids=positions).logits[0]
    logits = logits[len(prompt) - 1 - kept : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.vllm
async def test_vllm_recompute_recomputes_and_keep_keeps_the_old_kv(tiny_path):
    """On vLLM (a prefix cache): recompute drops the old weights' KV at the push, so the resumed
    turn is scored as a fresh forward under the new weights with no cached prompt token; keep reuses
    the cached blocks of the episode's earlier turn: its log-probs are exactly those of the old
    weights' KV over the cached prefix and the new weights over the rest, and differ from recompute's."""
    import torch

    old, new = _perturbed(tiny_path)
    engine = make_engine(backend="vllm", model="tiny", max_model_len=2048, kv_cache_memory_bytes=128 * 2**20)
    try:
        (first, resumed), hits = await _resumed_turn(engine, lambda: engine.update_weights(list(new.state_dict().items())))
        assert hits == 0  # nothing cached survived the push: the whole prompt was recomputed
        fresh = _scores(new, resumed.prompt_ids, resumed.response_ids)
        assert torch.allclose(torch.tensor(resumed.response_logprobs), fresh, atol=2e-3)

        await engine.update_weights(list(old.state_dict().items()))  # the old policy again, then keep
        (first, resumed), hits = await _resumed_turn(
            engine, lambda: engine.update_weights(list(new.state_dict().items()), keep_kv=True))
        assert hits > 0 and hits % 128 == 0  # whole cached blocks of the earlier turn's tokens
        kept = torch.tensor(resumed.response_logprobs)
        assert torch.allclose(kept, _kept_scores(old, new, resumed.prompt_ids, resumed.response_ids, hits), atol=2e-3)
        assert not torch.allclose(kept, _scores(new, resumed.prompt_ids, resumed.response_ids), atol=1e-2)
    finally:
        await engine.close()


@pytest.mark.parametrize("transport", ["inprocess", "http"])
async def test_proxy_agents_wait_at_the_gate_and_resume(tiny_path, transport):
    """An agent's model calls through the proxy pass the same gate: proxy episodes running at the
    update are carried over, and their later calls are sampled by the new policy.

    Groups 1-3 start once group 0 has made 4 model calls, so they are turns behind it when it ends."""
    from arl.rollout import ProxyEnvManager

    engine = _scripted(latency_s=0.01)

    class Staggered(ProxyEnvManager):
        go = asyncio.Event()
        calls = 0

        async def generate(self, traj, *args, **kwargs):
            gen = await super().generate(traj, *args, **kwargs)
            if traj.group_id == "train_0_0":
                Staggered.calls += 1
                if Staggered.calls >= 4:
                    Staggered.go.set()
            return gen

        async def run_episode(self, spec):
            if spec.group_id != "train_0_0":
                await Staggered.go.wait()
            return await super().run_episode(spec)

    sched = PartialScheduler("arl/FrozenLake-v0", num_groups=1, group_size=2, carry_over_groups=3, max_age=5)
    async with Staggered(engine, ManagerConfig(max_tokens=16, max_turns=6), transport=transport,
                         granularity="step") as manager:
        try:
            first = await sched.collect(manager, 0)
            assert list(first.groups) == ["train_0_0"] and all(e.trajectory.ok for e in first.episodes)
            assert first.metrics["rollout/partial_carried_episodes"] == 6
            await _until(lambda: sched.gate.held == 6)  # every carried agent's next call waits
            trained = {}
            for step in range(1, 4):
                await engine.update_weights([])
                sched.resume()
                batch = await sched.collect(manager, step)
                trained.update({g: eps for g, eps in batch.groups.items() if g in ("train_1_1", "train_2_2")})
            assert set(trained) == {"train_1_1", "train_2_2"}
            for episodes in trained.values():
                for e in episodes:  # one sample per model call, each with the version that sampled it
                    versions = [s.policy_version for s in e.samples]
                    assert versions == sorted(versions) and versions[0] == 0 and versions[-1] >= 1, versions
        finally:
            await sched.aclose()
    await engine.close()
