"""The hand-off between an event loop and an engine's driver thread.

A backend whose engine runs on its own thread (in-process vLLM, hf) must never block the event
loop: the loop queues commands (`Add`, `Abort`) for the driver, and the driver settles each
request's future on the loop that awaits it (`post` -> `settle`), from whatever thread it runs on.
A driver that stops fails what is still queued (`fail_queued`).
"""

from __future__ import annotations

import asyncio
import queue
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from arl.engine.vllm_lora import ServedAdapter


@attrs.define
class Pending:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    prompt_len: int
    version: int  # the policy version when generate() was called (the adapter's, once it gets one)
    adapter: ServedAdapter | None = None
    images: tuple[Any, ...] = ()  # an image request's PIL images (vLLM's multi_modal_data), in prompt order


@attrs.define
class Add:
    """A new request, queued by the event loop for the driver to add."""

    rid: str
    prompt: list[int]
    params: Any  # vllm.SamplingParams
    pending: Pending


@attrs.define
class Abort:
    """The caller of `rid` was cancelled: abort it if added, drop it if still queued."""

    rid: str


def take_all(inbox: queue.SimpleQueue) -> list[Any]:
    items = []
    while True:
        try:
            items.append(inbox.get_nowait())
        except queue.Empty:
            return items


def fail_queued(inbox: queue.SimpleQueue, exc: BaseException) -> None:
    """Fail every request still in `inbox` (safe from any thread: each item is taken once)."""
    for cmd in take_all(inbox):
        if isinstance(cmd, Add):
            post(cmd.pending, exc)


def release(pending: Pending) -> None:
    """The request no longer runs on its adapter (driver thread, or after the driver stopped)."""
    if pending.adapter is not None:
        pending.adapter.in_flight -= 1
        pending.adapter = None


def post(pending: Pending, result: Any) -> None:
    """Settle a request's future on its own event loop (from any thread)."""
    try:
        pending.loop.call_soon_threadsafe(settle, pending.future, result)
    except RuntimeError:  # that loop is closed: nobody awaits this future any more
        pass


def settle(future: asyncio.Future, result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


__all__ = ["Abort", "Add", "Pending", "fail_queued", "post", "release", "settle", "take_all"]
