"""GiGPO's anchor key is the game's ``state_key()``, wherever a key is taken: the step manager, the
fork manager (trunk and branches), the trajectory manager (what the verl loop reads) and proxy mode
(through GymRunner's step reports). The hash of the observation text is only the fallback for an
env that is not an arl game, and the turns say which one they got (issue 43 item 2).

The test game (tests/hidden_state_game.py): its grid never changes, a hidden counter (the presses so far) is the state that
matters, so a key taken from the observation text puts every turn in one anchor group.
"""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

import pytest
from hidden_state_game import HIDDEN_ID, WAIT_PRESS  # importing it registers the game

from arl.agents import STATE_KEY_INFO_KEY, EpisodeResult, GymRunner, ToolCallRunner
from arl.config import ForkConfig, ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.envs import TextEnv
from arl.envs.game import state_hash
from arl.rollout import EpisodeSpec, ForkEnvManager, StepEnvManager, TrajEnvManager, rollout_metrics
from arl.rollout.proxy import ProxyEnvManager

pytestmark = pytest.mark.anyio



def spec(seed: int = 0, member: int = 0, env_id: str = HIDDEN_ID) -> EpisodeSpec:
    return EpisodeSpec(env_id=env_id, seed=seed, group_id=f"train_0_{seed}", episode_id=member)


def hidden_counts(actions, start: int = 0) -> list[int]:
    """The presses before each action (the hidden state each one was taken in)."""
    out, n = [], start
    for action in actions:
        out.append(n)
        n += action == "Press"
    return out


def assert_keys_follow_the_hidden_state(keys, counts) -> None:
    """Equal hidden states share one key, different ones never do (and the grid never told them apart)."""
    assert len(keys) == len(counts) and len(set(counts)) >= 2
    by_count: dict[int, set] = defaultdict(set)
    for key, count in zip(keys, counts, strict=True):
        by_count[count].add(key)
    assert all(len(k) == 1 for k in by_count.values()), by_count
    assert len({next(iter(k)) for k in by_count.values()}) == len(by_count), by_count


def the_game_key(count: int) -> str:
    return state_hash(f"#o#|presses={count}")


@pytest.fixture
def wait_press(tiny_tokenizer):
    return ScriptedEngine(tiny_tokenizer, responses=WAIT_PRESS)


async def test_step_manager_keys_on_the_games_state_key(wait_press):
    episode = await StepEnvManager(wait_press, ManagerConfig(max_tokens=16, history_len=2)).run_episode(spec())
    turns, samples = episode.trajectory.turns, episode.samples
    assert episode.trajectory.ok and episode.trajectory.success, episode.trajectory.error
    assert len({t.observation for t in turns}) == 1  # the text never changes
    counts = hidden_counts(t.action for t in turns)
    assert counts == [0, 0, 1, 1, 2, 2]
    assert_keys_follow_the_hidden_state([s.state_key for s in samples], counts)
    assert [s.state_key for s in samples] == [t.state_key for t in turns] == [the_game_key(c) for c in counts]
    assert all(t.info["state_key_source"] == "game" for t in turns)
    assert rollout_metrics([episode])["rollout/state_key_fallback_rate"] == 0.0


async def test_traj_manager_turns_carry_the_games_key(wait_press):
    """The trajectory manager's turns are what the verl agent loop turns into ``arl_state_keys``."""
    episode = await TrajEnvManager(wait_press, ManagerConfig(max_tokens=16)).run_episode(spec())
    turns = episode.trajectory.turns
    counts = hidden_counts(t.action for t in turns)
    assert [t.state_key for t in turns] == [the_game_key(c) for c in counts]
    assert_keys_follow_the_hidden_state([t.state_key for t in turns], counts)
    assert all(t.info["state_key_source"] == "game" for t in turns)


async def test_fork_manager_keys_trunk_and_branches_on_the_games_state_key(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, actions=("Press", "Wait"), seed=3)
    config = ManagerConfig(max_tokens=16, history_len=2, fork=ForkConfig(k=3, at="every"))
    episode = await ForkEnvManager(engine, config).run_episode(spec(seed=1))
    traj = episode.trajectory
    assert traj.ok and traj.branches, traj.error
    trunk = hidden_counts(t.action for t in traj.turns)
    keys, counts = [t.state_key for t in traj.turns], list(trunk)
    for branch in traj.branches:  # a branch starts in the trunk's state at its fork
        keys += [t.state_key for t in branch.turns]
        counts += hidden_counts((t.action for t in branch.turns), start=trunk[branch.step])
        assert all(t.info["state_key_source"] == "game" for t in branch.turns)
    assert_keys_follow_the_hidden_state(keys, counts)
    assert keys == [the_game_key(c) for c in counts]
    forked = defaultdict(set)
    for s in episode.samples:
        if s.fork_id is not None:
            forked[s.fork_id].add(s.state_key)
    assert forked and all(len(k) == 1 for k in forked.values())  # a fork's K rows: one state, one key


@pytest.mark.parametrize("granularity", ["step", "traj"])
async def test_proxy_keys_come_from_the_runners_game_state_key(wait_press, granularity):
    """GymRunner reports its game's ``state_key()`` per step; the proxy hashes it as the step manager does."""
    manager = ProxyEnvManager(wait_press, ManagerConfig(max_tokens=16), granularity=granularity)
    episode = await manager.run_episode(spec())
    turns = episode.trajectory.turns
    assert episode.trajectory.ok, episode.trajectory.error
    counts = hidden_counts(t.action for t in turns)
    assert counts == [0, 0, 1, 1, 2, 2]
    assert [t.state_key for t in turns] == [the_game_key(c) for c in counts]
    assert_keys_follow_the_hidden_state([t.state_key for t in turns], counts)
    assert all(t.info["state_key_source"] == "game" for t in turns)
    assert episode.samples[0].info["state_keys_from_runner"] == len(turns)
    metrics = rollout_metrics([episode])
    assert (metrics["rollout/state_key_from_runner_rate"], metrics["rollout/state_key_fallback_rate"]) == (1.0, 0.0)
    if granularity == "step":
        assert [s.state_key for s in episode.samples] == [t.state_key for t in turns]


async def test_step_and_proxy_modes_agree_on_every_key(tiny_tokenizer):
    """The same replies in the same states give the same anchor keys, whichever mode played them."""
    step = await StepEnvManager(ScriptedEngine(tiny_tokenizer, responses=WAIT_PRESS),
                                ManagerConfig(max_tokens=16)).run_episode(spec())
    proxy = await ProxyEnvManager(ScriptedEngine(tiny_tokenizer, responses=WAIT_PRESS), ManagerConfig(max_tokens=16),
                                  granularity="step").run_episode(spec())
    assert [t.state_key for t in step.trajectory.turns] == [t.state_key for t in proxy.trajectory.turns]


# -- the runners' step reports (what proxy mode keys on) ------------------------------------------------


class Replies:
    """An `openai.AsyncOpenAI`-shaped client answering from a list, in turn."""

    def __init__(self, replies) -> None:
        self.replies, self.n = list(replies), 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, **kwargs):
        content, calls = self.replies[self.n % len(self.replies)]
        self.n += 1
        tool_calls = [SimpleNamespace(model_dump=lambda exclude_none=True, c=c: c) for c in calls] if calls else None
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content, tool_calls=tool_calls))])


def move(action: str) -> tuple[None, list[dict]]:
    return None, [{"type": "function", "function": {"name": "move", "arguments": json.dumps({"direction": action})}}]


@pytest.mark.parametrize("runner_cls, replies", [
    (GymRunner, [(r, None) for r in WAIT_PRESS]),
    (ToolCallRunner, [move("Wait"), move("Press")]),
])
async def test_runners_report_the_games_state_key_of_each_step(runner_cls, replies):
    result = await runner_cls(Replies(replies), HIDDEN_ID).run_job(0)
    assert result.status == "Finished" and result.success
    reports, alignment = result.steps(len(result.step_scores))
    assert alignment == "exact"
    counts = hidden_counts(r.action for r in reports)
    assert [r.state_key for r in reports] == [f"#o#|presses={c}" for c in counts]
    assert {r.observation for r in reports} == {"#o#"}  # the observation text: one for every state
    # on the wire (push / pull mode send the JSON) the key survives next to the state
    again = EpisodeResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again.steps(len(reports)) == (reports, "exact")
    assert all(info[STATE_KEY_INFO_KEY] == r.state_key for info, r in zip(result.step_infos, reports, strict=True))


async def test_a_runner_on_an_env_that_is_no_game_reports_no_key_and_the_proxy_says_so(wait_press):
    class OpaqueRunner(GymRunner):
        def make_env(self):
            return Opaque(self.env_id)

    def factory(client, spec, config):
        return OpaqueRunner(client, spec.env_id, max_tokens=16)

    result = await OpaqueRunner(Replies([(r, None) for r in WAIT_PRESS]), HIDDEN_ID).run_job(0)
    assert result.step_infos and all(STATE_KEY_INFO_KEY not in info for info in result.step_infos)
    episode = await ProxyEnvManager(wait_press, ManagerConfig(max_tokens=16), factory,
                                    granularity="step").run_episode(spec())
    turns = episode.trajectory.turns
    assert turns and all(t.info["state_key_source"] == "observation" for t in turns)
    assert {t.state_key for t in turns} == {state_hash("#o#")}
    metrics = rollout_metrics([episode])
    assert (metrics["rollout/state_key_from_runner_rate"], metrics["rollout/state_key_fallback_rate"]) == (1.0, 1.0)


# -- envs that are not arl games: the observation hash, said so ----------------------------------------


class Opaque:
    """A text env that is not an arl game (no ``state_key`` anywhere): a TextEnv behind a facade."""

    def __init__(self, env_id: str) -> None:
        self._inner = TextEnv(env_id)
        self.instructions, self.max_steps = self._inner.instructions, self._inner.max_steps

    def reset(self, **kwargs):
        return self._inner.reset(**kwargs)

    def step(self, action):
        return self._inner.step(action)


class OpaqueStepManager(StepEnvManager):
    def make_env(self, spec, traj):
        return Opaque(spec.env_id)


async def test_an_env_that_is_no_game_is_keyed_by_its_observation_and_says_so(wait_press):
    episode = await OpaqueStepManager(wait_press, ManagerConfig(max_tokens=16)).run_episode(spec())
    turns = episode.trajectory.turns
    assert turns and all(t.info["state_key_source"] == "observation" for t in turns)
    assert [s.state_key for s in episode.samples] == [state_hash(t.observation) for t in turns]
    assert len({s.state_key for s in episode.samples}) == 1  # what the text shows is all it can key on
    assert rollout_metrics([episode])["rollout/state_key_fallback_rate"] == 1.0


# -- the shipped games: the same anchor groups as the observation text gave ------------------------------


@pytest.mark.parametrize("env_id, env_kwargs", [
    ("arl/FrozenLake-v0", {}),
    ("arl/Sokoban-v0", {}),
    ("arl/FrozenLake-v0", {"cell_separator": " ", "positions": True, "surroundings": True}),
    ("arl/Sokoban-v0", {"cell_separator": " ", "positions": True}),
])
async def test_shipped_games_group_as_their_observation_text_did(scripted_engine, env_id, env_kwargs):
    """FrozenLake's and Sokoban's state keys are a one-to-one image of their grid text, so the anchor
    groups do not change; with the default text (no extra lines, no separator) neither do the keys."""
    scripted_engine.invalid_rate = 0.2
    manager = StepEnvManager(scripted_engine, ManagerConfig(max_tokens=16, history_len=1, env_kwargs=env_kwargs))
    episodes = [await manager.run_episode(spec(seed=s, member=m, env_id=env_id)) for s in (2, 5) for m in range(3)]
    by_key, by_text = defaultdict(set), defaultdict(set)
    for e in episodes:
        for t in e.trajectory.turns:
            by_key[(e.trajectory.group_id, t.state_key)].add(t.observation)
            by_text[(e.trajectory.group_id, t.observation)].add(t.state_key)
            if not env_kwargs:
                assert t.state_key == state_hash(t.observation)
    assert all(len(v) == 1 for v in by_key.values()) and all(len(v) == 1 for v in by_text.values())
    assert len(by_key) == len(by_text) > 2
