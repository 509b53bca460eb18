"""Sandbox uids and tool uid blocks are never handed out twice while held (issue 47 §B).

Inside a pull-mode agent's block a sandbox's uid comes from the block's free set, given back when
the sandbox closes; a block with every uid held refuses (`UidBlockExhausted`) instead of wrapping
around to a uid a live sandbox still runs as. Across trainer processes on one host, blocks and
sandbox uids are held in a registry of record locks (`UID_REGISTRY_PATHS`). No root needed: only
the bookkeeping is exercised.
"""

from __future__ import annotations

import multiprocessing
import random

import pytest

from arl.sandbox import bwrap
from arl.sandbox.bwrap import UidBlockExhausted, fresh_uid, fresh_uid_block, release_uid, release_uid_block
from arl.sandbox.uid_delegation import TOOL_UIDS_ENV

pytestmark = pytest.mark.timeout(120)
BLOCK = range(40_000_000, 40_000_004)


@pytest.fixture
def small_block(monkeypatch):
    monkeypatch.setenv(TOOL_UIDS_ENV, f"{BLOCK.start}:{len(BLOCK)}")
    yield BLOCK
    for uid in list(bwrap._uids_held):
        if uid in BLOCK:
            release_uid(uid)
    bwrap._block_free.pop(BLOCK, None)


def test_an_exhausted_block_refuses_and_a_released_uid_comes_back(small_block):
    held = [fresh_uid() for _ in small_block]
    assert sorted(held) == list(small_block)
    with pytest.raises(UidBlockExhausted, match="are held by live sandboxes"):
        fresh_uid()
    release_uid(held[2])
    assert fresh_uid() == held[2]
    with pytest.raises(UidBlockExhausted):
        fresh_uid()


def test_no_held_uid_is_handed_out_twice(small_block):
    rng, held = random.Random(47), set()
    for _ in range(2000):
        if held and (len(held) == len(small_block) or rng.random() < 0.5):
            uid = rng.choice(sorted(held))
            held.discard(uid)
            release_uid(uid)
        else:
            uid = fresh_uid()
            assert uid in small_block and uid not in held
            held.add(uid)


def test_a_sandbox_gives_its_uid_back_when_closed(small_block):
    from arl.sandbox.sandbox import Sandbox

    boxes = [Sandbox(isolation="none") for _ in small_block]
    try:
        assert sorted(b.uid for b in boxes) == list(small_block)
        with pytest.raises(UidBlockExhausted):
            Sandbox(isolation="none")
        boxes[0].close_sync()
        assert Sandbox(isolation="none").uid == boxes[0].uid  # closed at once: no reference kept
    finally:
        for b in boxes:
            b.close_sync()


def _draw_blocks(registry: str, n: int, out, go) -> None:
    """A second trainer process: draws ``n`` blocks (from 8 possible ones) and holds them."""
    bwrap.UID_REGISTRY_PATHS[:] = [registry]
    rng = random.Random()
    bwrap.secrets.randbelow = lambda _: rng.randrange(8)  # collisions are certain without the registry
    out.put([fresh_uid_block().start for _ in range(n)])
    go.wait(60)


def test_two_processes_never_hold_the_same_block(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_draw_blocks, args=(str(tmp_path / "uids.lock"), 4, out, go)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        drawn = [out.get(timeout=60) for _ in procs]
    finally:
        go.set()
        for p in procs:
            p.join(30)
    assert len(set(drawn[0]) | set(drawn[1])) == 8, drawn  # all 8 blocks, none twice


def test_a_released_block_can_be_drawn_again_by_this_process():
    block = fresh_uid_block()
    release_uid_block(block)
    release_uid_block(block)  # twice: harmless
    assert block.start not in bwrap._blocks_held
