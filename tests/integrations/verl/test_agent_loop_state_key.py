"""The verl agent loop's ``arl_state_keys`` are the game's ``state_key()`` hashes, in traj and proxy
mode, and ``arl_state_key_sources`` says so (issue 43 item 2): a game whose grid never changes but
whose hidden counter does (tests/hidden_state_game.py) gets one anchor key per hidden state, not one
for the whole episode."""

from __future__ import annotations

import pytest
from hidden_state_game import HIDDEN_ID, WAIT_PRESS  # importing it registers the game

from arl.engine.scripted import ScriptedEngine
from arl.envs.game import state_hash

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", ["traj", "proxy"])
async def test_state_keys_are_the_games_not_the_texts(make_loop, tiny_tokenizer, mode):
    engine = ScriptedEngine(tiny_tokenizer, responses=WAIT_PRESS)
    loop, server = make_loop(engine, {"mode": mode, "manager": {"max_tokens": 16}})
    row = {"extra_info": {"env_id": HIDDEN_ID, "seed": 0, "tag": "train", "index": 0}, "uid": "u0",
           "session_id": 0, "raw_prompt": [{"role": "user", "content": "play"}]}
    out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **row)
    assert out.extra_fields["arl_success"] and len(server.calls) == 6
    assert out.extra_fields["arl_state_keys"] == [state_hash(f"#o#|presses={c}") for c in (0, 0, 1, 1, 2, 2)]
    assert out.extra_fields["arl_state_key_sources"] == ["game"] * 6


def test_a_turn_without_any_state_gets_an_anchor_group_of_its_own():
    """A proxy call with no user/tool message and no observation has no known state: it is keyed
    by its own turn, not by the hash of "" that would pool every such turn into one group."""
    from arl.integrations.verl.agent_loop import turn_state_key
    from arl.rollout.records import Turn

    def turn(observation="", key=None, source=None):
        return Turn(observation=observation, prompt_ids=[], response_ids=[], response_logprobs=[], state_key=key,
                    info={} if source is None else {"state_key_source": source})

    blind = [turn_state_key(turn(), f"u{i}/0")[0] for i in range(3)]
    assert len(set(blind)) == 3 and state_hash("") not in blind
    assert turn_state_key(turn("#o#"), "u/0") == (state_hash("#o#"), "observation")
    assert turn_state_key(turn(key="k", source="game"), "u/0") == ("k", "game")
