"""TextEnv: answer parsing (examples + fuzzing), invalid turns, penalties, info keys."""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl.envs import FrozenLakeEnv, Game, SokobanEnv, TextEnv, parse_answer

SOKOBAN_ACTIONS = ["Up", "Down", "Left", "Right"]
LEVEL = "######\n#P___#\n#_X__#\n#____#\n#_O__#\n######"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>Right</answer>", "Right"),
        ("  <answer>right</answer>\n", "Right"),
        ("<answer> Right </answer>", "Right"),
        ("<ANSWER>\nUP\n</ANSWER>", "Up"),
        ("<think>push the box down</think><answer>Down</answer>", "Down"),
        ("<think>multi\nline <b>tags</b></think>\n  <answer>left</answer>", "Left"),
        ("<Think>x</THINK><answer>Left</answer>", "Left"),
        ("Right", None),
        ("I go <answer>Right</answer>", None),
        ("<answer>Right</answer> because", None),
        ("<answer>Right</answer><answer>Left</answer>", None),
        ("<think><answer>Up</answer></think><answer>Right</answer>", None),
        ("<think>a</think> text <answer>Up</answer>", None),
        ("<think>a</think>b</think><answer>Up</answer>", None),
        ("<answer>Jump</answer>", None),
        ("<answer>Right Left</answer>", None),
        ("<answer></answer>", None),
        ("<answer>Right", None),
        ("", None),
    ],
)
def test_parse_answer_examples(text, expected):
    assert parse_answer(text, SOKOBAN_ACTIONS) == expected


@given(st.text())
def test_parse_never_raises_on_any_text(text):
    result = parse_answer(text, SOKOBAN_ACTIONS)
    assert result is None or result in SOKOBAN_ACTIONS


@given(
    st.sampled_from(SOKOBAN_ACTIONS),
    st.sampled_from([str.lower, str.upper, str.title]),
    st.text(alphabet=" \t\n", max_size=3),
    st.text(alphabet=" \t\n", max_size=3),
    st.one_of(
        st.none(), st.text().filter(lambda t: "</think>" not in t.lower() and "<answer>" not in t.lower())
    ),
)
def test_parse_accepts_every_well_formed_answer(name, case, ws1, ws2, think):
    prefix = "" if think is None else f"<think>{think}</think>"
    assert parse_answer(f"{ws1}{prefix}<answer>{ws2}{case(name)}{ws1}</answer>{ws2}", SOKOBAN_ACTIONS) == name


@given(st.text(min_size=1).filter(lambda t: t.strip() != ""), st.sampled_from(SOKOBAN_ACTIONS))
def test_extra_text_outside_tags_is_invalid(junk, name):
    if junk.strip().lower().startswith("<think>"):
        return  # may itself be a well-formed think block
    assert parse_answer(f"{junk}<answer>{name}</answer>", SOKOBAN_ACTIONS) is None
    assert parse_answer(f"<answer>{name}</answer>{junk}", SOKOBAN_ACTIONS) is None


def text_env() -> TextEnv:
    return TextEnv("arl/Sokoban-v0")


def test_text_env_api_and_valid_step():
    env = text_env()
    assert env.game_name == "sokoban" and env.max_steps == 10
    assert env.action_names == SOKOBAN_ACTIONS and env.format_penalty == pytest.approx(-0.15)
    assert isinstance(env.observation_space, gym.spaces.Text)
    assert isinstance(env.action_space, gym.spaces.Text)
    assert env.instructions.startswith("You are solving the Sokoban puzzle.")
    for needle in ("#: wall", "√: box on target", "Up, Down, Left, Right", "<answer>"):
        assert needle in env.instructions
    obs, info = env.reset(seed=0, options={"level": LEVEL})
    assert obs == LEVEL and info["raw_obs"] == LEVEL
    assert obs in env.observation_space
    obs, reward, terminated, truncated, info = env.step("<answer>Right</answer>")
    assert reward == pytest.approx(-0.1) and not terminated and not truncated
    assert info["action_valid"] and info["action_effective"] and not info["success"]
    assert info["action"] == "Right" and info["raw_obs"] == obs and obs.split("\n")[1] == "#_P__#"
    env.step("<answer>down</answer>")
    obs, reward, terminated, _, info = env.step("<think>one more</think><answer>Down</answer>")
    assert reward == pytest.approx(10.9) and terminated and info["success"]


@pytest.mark.parametrize("bad", ["Right", "<answer>Fly</answer>", 42, None, b"<answer>Up</answer>"])
def test_invalid_answer_is_penalised_noop(bad):
    env = text_env()
    obs0, _ = env.reset(seed=0, options={"level": LEVEL})
    obs, reward, terminated, truncated, info = env.step(bad)
    assert obs == obs0
    assert reward == pytest.approx(-0.1 - 0.15)  # Sokoban still pays the step, plus the penalty
    assert not info["action_valid"] and not info["action_effective"] and info["action"] is None
    assert info["elapsed_steps"] == 1 and env.actions_left == 9


def test_invalid_turns_count_against_the_limit():
    env = TextEnv("arl/Sokoban-v0", format_penalty=-0.5)
    env.reset(seed=0)
    results = [env.step("nonsense") for _ in range(10)]
    assert [r[3] for r in results] == [False] * 9 + [True]
    assert all(r[1] == pytest.approx(-0.6) for r in results)


def test_frozen_lake_text_env():
    env = TextEnv("arl/FrozenLake-v0")
    assert env.game_name == "frozen_lake" and env.max_steps == 10
    assert env.action_names == ["Left", "Down", "Right", "Up"]
    assert env.format_penalty == pytest.approx(-0.01)
    assert "frozen lake" in env.instructions and "O: hole" in env.instructions
    obs0, info = env.reset(seed=0, options={"map": ["SFFF", "FFFF", "FFFF", "FFFG"]})
    obs, reward, *_rest, info = env.step("<answer>Up</answer>")
    assert obs == obs0 and reward == 0.0 and info["action_valid"] and not info["action_effective"]
    obs, reward, *_rest, info = env.step("up please")
    assert obs == obs0 and reward == pytest.approx(-0.01) and not info["action_valid"]
    obs, reward, *_rest, info = env.step("<answer>Right</answer>")
    assert obs.split("\n")[0] == "_P__" and info["raw_obs"] == obs


def test_cell_separator_spaces_cells_not_rows_nor_the_state():
    plain, spaced = TextEnv("arl/FrozenLake-v0"), TextEnv("arl/FrozenLake-v0", cell_separator=" ")
    a, _ = plain.reset(seed=5)
    b, info = spaced.reset(seed=5)
    assert b == "\n".join(" ".join(row) for row in a.split("\n")) and info["raw_obs"] == b
    assert b.split("\n")[0].count(" ") == 3 and spaced.observation_space.contains(b)
    assert spaced.unwrapped.state_key() == plain.unwrapped.state_key()  # the game's state is the same
    obs, *_ = spaced.step("<answer>Down</answer>")
    assert spaced.observation_space.contains(obs) and obs.replace(" ", "") == plain.step("<answer>Down</answer>")[0]
    sokoban = TextEnv("arl/Sokoban-v0", cell_separator=" ")
    obs, _ = sokoban.reset(seed=0)
    assert sokoban.observation_space.contains(obs) and all(len(r) == 11 for r in obs.split("\n"))
    with pytest.raises(ValueError, match="newline"):
        TextEnv("arl/FrozenLake-v0", cell_separator="\n")


def test_text_env_wraps_instances_and_alt_vocab():
    env = TextEnv(SokobanEnv(vocabulary="alt"))
    assert env.max_steps is None  # no TimeLimit around a bare instance
    obs, _ = env.reset(seed=3)
    assert set(obs) <= set("W.GCBA@\n")
    assert "W: wall" in env.instructions
    assert TextEnv(FrozenLakeEnv(is_slippery=True)).instructions.count("slippery") == 1
    with pytest.raises(TypeError):
        TextEnv(gym.make("CartPole-v1"))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.one_of(st.text(max_size=40), st.sampled_from(["<answer>Up</answer>", "<answer>left</answer>"]))
    )
)
def test_any_reply_sequence_steps_without_error(replies):
    env = TextEnv("arl/Sokoban-v0")
    env.reset(seed=1)
    for reply in replies:
        obs, reward, terminated, truncated, info = env.step(reply)
        assert isinstance(obs, str) and isinstance(reward, float)
        assert info["action_valid"] == (env.parse_action(reply) is not None)
        if terminated or truncated:
            env.reset()


def test_positions_name_where_things_are_and_leave_the_state_alone():
    import doctest

    from arl.envs import text

    assert doctest.testmod(text).failed == 0
    plain, located = TextEnv("arl/FrozenLake-v0", cell_separator=" "), TextEnv(
        "arl/FrozenLake-v0", cell_separator=" ", positions=True)
    obs, _ = plain.reset(seed=5)
    obs_p, info = located.reset(seed=5)
    grid, line = obs_p.rsplit("\n", 1)
    assert grid == obs and line.startswith(("O:", "G:", "P:")) and "P: row " in line
    rows = [r.replace(" ", "") for r in grid.split("\n")]
    r, c = next((i + 1, row.index("P") + 1) for i, row in enumerate(rows) if "P" in row)
    assert f"P: row {r} col {c}." in line
    assert located.observation_space.contains(obs_p)
    assert plain.env.unwrapped.state_key() == located.env.unwrapped.state_key()
    obs_p, *_ = located.step("<answer>Down</answer>")
    assert located.observation_space.contains(obs_p)
    sok = TextEnv("arl/Sokoban-v0", positions=True)
    obs_s, _ = sok.reset(seed=1)
    assert "#:" not in obs_s.rsplit("\n", 1)[1] and "P: row" in obs_s


def test_surroundings_say_what_each_action_meets_and_where_the_goal_is():
    plain = TextEnv("arl/FrozenLake-v0", cell_separator=" ")
    looked = TextEnv("arl/FrozenLake-v0", cell_separator=" ", surroundings=True)
    obs, _ = plain.reset(seed=5)
    obs_s, _ = looked.reset(seed=5)
    grid, line = obs_s.rsplit("\n", 1)
    assert grid == obs and looked.observation_space.contains(obs_s)
    rows = [r.replace(" ", "") for r in grid.split("\n")]
    (pr, pc), (gr, gc) = ((next((i, row.index(s)) for i, row in enumerate(rows) if s in row)) for s in "PG")
    words = dict(part.split(": ") for part in line.split(". ") if not part.startswith("Goal"))
    names = {"_": "frozen", "O": "hole", "G": "goal"}
    for action, (dr, dc) in zip(["Left", "Down", "Right", "Up"], [(0, -1), (1, 0), (0, 1), (-1, 0)], strict=True):
        r, c = pr + dr, pc + dc
        expected = names[rows[r][c]] if 0 <= r < 4 and 0 <= c < 4 else "edge"
        assert words[action].rstrip(".") == expected
    goal = line.split("Goal: ")[1].rstrip(".").split(", ")
    assert sum(int(n) for _, n in (g.split() for g in goal)) == abs(gr - pr) + abs(gc - pc)
    assert plain.env.unwrapped.state_key() == looked.env.unwrapped.state_key()
    for reply in ["<answer>Down</answer>", "<answer>Right</answer>", "nonsense"]:
        obs_s, *_ = looked.step(reply)
        assert looked.observation_space.contains(obs_s)
    sok = TextEnv("arl/Sokoban-v0", surroundings=True)
    obs_k, _ = sok.reset(seed=1)
    assert obs_k.rsplit("\n", 1)[1].startswith("Up: ") and "Goal" not in obs_k
    with pytest.raises(TypeError, match="surroundings"):
        TextEnv(_NoDeltas(), surroundings=True)


class _NoDeltas(Game):
    """An arl game in every attribute but the moves' deltas."""

    action_names = ["Left", "Right"]
    game_name, description, symbols = "nodeltas", "a test game", "_P"
    symbol_names = {"_": "floor", "P": "player"}
    observation_space = gym.spaces.Box(0, 1, (1, 2))
    action_space = gym.spaces.Discrete(2)

    def grid_text(self) -> str:
        return "P_"
