"""Agents that re-send past turns in their own form (smolagents): every call forks; the tracker
counts each such fork as a history rewrite per episode and says once in the log that
granularity "step" fits the agent. Plain forks (a retry from an earlier prefix) are not rewrites."""

from __future__ import annotations

import logging

import pytest

from arl.engine.scripted import ScriptedEngine
from arl.intercept import ChatHandler, InProcessClient, MessageTracker
from arl.intercept import tracker as tracker_mod

pytestmark = pytest.mark.anyio

TASK = [{"role": "system", "content": "You solve tasks."}, {"role": "user", "content": "New task: add 1 and 2"}]
SCRIPT = ["Thought: add.\nAction: add(1, 2)  ", "Thought: done.\nFinal answer: 3"]


async def smolagents_like(client, turns: int = 2) -> None:
    """Each call re-sends the history with the model's output rewritten (stripped, with the tool
    call appended in the agent's own text format) and the observation as a user message."""
    memory = list(TASK)
    for _ in range(turns):
        reply = await client.chat.completions.create(model="arl", messages=memory)
        text = reply.choices[0].message.content
        memory += [{"role": "assistant", "content": text.strip() + "\nCalling tools:\n[{'name': 'add'}]"},
                   {"role": "user", "content": "Observation:\n3"}]


def episode(tokenizer, **kw):
    tracker = MessageTracker(tokenizer, **kw)
    handler = ChatHandler(ScriptedEngine(tokenizer, responses=SCRIPT), tracker)
    return tracker, InProcessClient(handler, "e")


async def test_rewritten_history_is_counted_and_step_mode_named_once(tiny_tokenizer, caplog, monkeypatch):
    monkeypatch.setattr(tracker_mod, "_REWRITE_WARNED", [])
    caplog.set_level(logging.WARNING, logger="arl.intercept.tracker")
    for _ in range(2):  # two episodes: counted in each, logged once
        tracker, client = episode(tiny_tokenizer)
        await smolagents_like(client, turns=3)
        assert tracker.stats["forks"] == 2 and tracker.stats["history_rewrites"] == 2
        assert tracker.stats["untracked_assistant"] == 2 and len(tracker.traj_samples()) == 3
    logged = [r for r in caplog.records if "granularity='step'" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING
    assert "history_rewrites" in logged[0].getMessage()


async def test_a_retry_fork_is_not_a_rewrite_and_step_mode_does_not_warn(tiny_tokenizer, caplog, monkeypatch):
    monkeypatch.setattr(tracker_mod, "_REWRITE_WARNED", [])
    caplog.set_level(logging.WARNING, logger="arl.intercept.tracker")
    tracker, client = episode(tiny_tokenizer)
    await client.chat.completions.create(model="arl", messages=TASK)
    await client.chat.completions.create(model="arl", messages=TASK)  # a retry: the same prefix again
    assert tracker.stats["forks"] == 1 and tracker.stats["history_rewrites"] == 0
    tracker, client = episode(tiny_tokenizer, granularity="step")
    await smolagents_like(client)
    assert tracker.stats["history_rewrites"] == 1
    assert not [r for r in caplog.records if "granularity" in r.getMessage()]
