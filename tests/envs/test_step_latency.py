"""TextEnv's step_latency: a heavy-tailed wait after every game step that the managers await.

The waits are pure functions of their key (the same on every run and in every mode), the game
never sees the episode name the managers pass, and an awaited wait lets the other episodes on
the loop run: a batch of slow episodes takes about one episode's wait, not their sum.
"""

from __future__ import annotations

import time

import anyio
import pytest

from arl.config import ManagerConfig
from arl.envs.latency import ParetoLatency
from arl.envs.text import TextEnv
from arl.rollout import EpisodeSpec, StepEnvManager, TrajEnvManager

ENV = "arl/FrozenLake-v0"


def waits(env: TextEnv, seed: int, episode: str | None, steps: int = 3) -> list[float]:
    env.reset(seed=seed, options=None if episode is None else {"episode": episode})
    out = []
    for _ in range(steps):
        *_, info = env.step_action("Left")  # step_action: the info without the wait itself
        out.append(info["latency_s"])
    return out


def test_off_by_default_and_the_info_says_nothing():
    env = TextEnv(ENV)
    env.reset(seed=1)
    assert env.step_latency is None
    *_, info = env.step("<answer>Left</answer>")
    assert "latency_s" not in info


def test_waits_are_drawn_per_episode_task_or_step():
    draw = {"alpha": 1.2, "scale_s": 0.01, "cap_s": 1.0}
    per_episode = TextEnv(ENV, step_latency=draw)
    a, b = waits(per_episode, 3, "train_0_3/0"), waits(per_episode, 3, "train_0_3/1")
    assert len(set(a)) == 1 and len(set(b)) == 1 and a != b  # one wait per episode; members differ
    assert waits(TextEnv(ENV, step_latency=draw), 3, "train_0_3/0") == a  # the same on a fresh env
    assert a[0] == ParetoLatency(**draw).draw_s("train_0_3/0")

    per_task = TextEnv(ENV, step_latency={**draw, "per": "task"})
    assert waits(per_task, 3, "train_0_3/0") == waits(per_task, 3, "train_0_3/1")  # a group waits alike
    assert waits(per_task, 3, "x")[0] != waits(per_task, 4, "x")[0]

    per_step = TextEnv(ENV, step_latency={**draw, "per": "step"})
    steps = waits(per_step, 3, "train_0_3/0", steps=4)
    assert len(set(steps)) == 4  # a fresh draw every step
    assert steps[2] == ParetoLatency(**draw).draw_s("train_0_3/0|2")


def test_the_game_never_sees_the_episode_name():
    seen = []
    env = TextEnv(ENV, step_latency={"scale_s": 0.01})
    inner = env.env.reset

    def spy(*, seed=None, options=None):
        seen.append(options)
        return inner(seed=seed, options=options)

    env.env.reset = spy
    env.reset(seed=1, options={"episode": "e"})
    env.reset(seed=1, options={"episode": "e", "other": 1})
    assert seen == [None, {"other": 1}]


@pytest.mark.parametrize("bad", [{"per": "group"}, {"alpha": 0}, {"scale_s": 2.0, "cap_s": 7200},
                                 {"speed": 1}, 0.5])
def test_a_bad_option_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="step_latency"):
        TextEnv(ENV, step_latency=bad)


def test_step_sleeps_and_astep_awaits_the_wait():
    fixed = {"alpha": 1.2, "scale_s": 0.2, "cap_s": 0.2}  # every draw is >= scale: capped, exactly 0.2 s
    env = TextEnv(ENV, step_latency=fixed)
    env.reset(seed=1)
    start = time.perf_counter()
    *_, info = env.step("<answer>Left</answer>")
    assert info["latency_s"] == 0.2 and time.perf_counter() - start >= 0.2

    async def two_at_once() -> float:
        envs = [TextEnv(ENV, step_latency=fixed) for _ in range(2)]
        for e in envs:
            e.reset(seed=1)
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for e in envs:
                tg.start_soon(e.astep, "<answer>Left</answer>")
        return time.perf_counter() - start

    assert anyio.run(two_at_once) < 0.39  # side by side: one wait, not two


@pytest.mark.parametrize("manager", [StepEnvManager, TrajEnvManager])
@pytest.mark.anyio
async def test_managers_await_the_wait_side_by_side(manager, scripted_engine):
    """8 episodes of at most 3 steps that wait 0.25 s after each: run one after the other they
    would take >= 8 x their steps x 0.25 s; awaited side by side, about one episode's share."""
    fixed = {"alpha": 1.2, "scale_s": 0.25, "cap_s": 0.25}
    config = ManagerConfig(max_tokens=16, max_turns=3, env_kwargs={"step_latency": fixed})
    specs = [EpisodeSpec(env_id=ENV, seed=2, group_id="train_0_2", episode_id=m) for m in range(8)]
    m = manager(scripted_engine, config)
    start = time.perf_counter()
    episodes = []
    async with anyio.create_task_group() as tg:
        for s in specs:
            async def run(s=s):
                episodes.append(await m.run_episode(s))
            tg.start_soon(run)
    wall = time.perf_counter() - start
    turns = [len(e.trajectory.turns) for e in episodes]
    assert all(e.trajectory.ok for e in episodes), [e.trajectory.error for e in episodes]
    for e in episodes:  # the wait is the env's time, and every turn's info records it
        assert e.trajectory.timings["env"] >= 0.25 * len(e.trajectory.turns)
        assert all(t.info["latency_s"] == 0.25 for t in e.trajectory.turns)
    assert wall < 0.5 * 0.25 * sum(turns)  # serial would be the sum
