"""MessageTracker memory: linear in the episode's length, not quadratic.

Every request re-sends the whole history. A committed request must not keep its own copy of it:
its prompt is a view of its branch's one token list and it holds no message list.
"""

from __future__ import annotations

import gc
import tracemalloc

from arl.engine.prompt import PromptView
from arl.intercept.tracker import MessageTracker
from arl.rollout.base import chat_ids, end_of_turn_ids

OBS = "#" * 40 + "\n" + "_P_O_#" * 6  # a game-grid-sized observation: ~80 tokens per user turn


def play(tokenizer, turns: int, fork_at: int | None = None) -> MessageTracker:
    """A conversation of `turns` requests, each re-sending the whole history (as agents do)."""
    tracker = MessageTracker(tokenizer)
    eot = end_of_turn_ids(tokenizer)
    messages = [{"role": "system", "content": "You play games."}]
    for t in range(turns):
        if t == fork_at:  # the agent drops its history: a new branch
            messages = messages[:1]
        messages.append({"role": "user", "content": f"turn {t}\n{OBS}"})
        prompt = tracker.prepare(messages)
        text = "<answer>Left</answer>"
        ids = tokenizer.encode(text, add_special_tokens=False) + eot
        reply = {"role": "assistant", "content": text}
        tracker.commit(prompt, ids, [-0.5] * len(ids), "stop", reply)
        messages.append(reply)
    return tracker


def test_committed_prompts_are_views_of_their_branch(tiny_tokenizer):
    tracker = play(tiny_tokenizer, 12, fork_at=7)
    assert len(tracker.branches) == 2
    by_id = {b.id: b for b in tracker.branches}
    for r in tracker.requests:
        view = r.prompt.prompt_ids
        assert isinstance(view, PromptView) and view._ids is by_id[r.branch].ids  # shared, not copied
        assert r.prompt.nodes == [] and r.prompt.depth > 0
    # the views still read as the exact prompts: the template's rendering + the generation prompt
    step = tracker.step_samples()
    messages = [{"role": "system", "content": "You play games."}, {"role": "user", "content": f"turn 0\n{OBS}"}]
    first = chat_ids(tiny_tokenizer, messages, add_generation_prompt=True)
    assert list(tracker.requests[0].prompt.prompt_ids) == first
    assert step[0].input_ids[: len(first)] == first


def _heap_kib(tokenizer, turns: int) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracker = play(tokenizer, turns)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    del tracker
    return held / 1024


def test_heap_grows_linearly_with_turns(tiny_tokenizer):
    """4x the turns must hold about 4x the memory (quadratic storage would hold ~16x)."""
    _heap_kib(tiny_tokenizer, 4)  # warm the tokenizer's and the template's caches
    short, long = _heap_kib(tiny_tokenizer, 15), _heap_kib(tiny_tokenizer, 60)
    assert long / short < 6.0, f"15 turns: {short:.0f} KiB, 60 turns: {long:.0f} KiB ({long / short:.1f}x)"
