"""In-process vLLM: `LLMEngine` stepped by one driver thread behind a lock-free asyncio facade.

Why this shape: with `VLLM_ENABLE_V1_MULTIPROCESSING=0`, `LLMEngine` keeps its engine core and
worker in this process, so prompts and outputs never cross a process boundary. One driver thread
owns the engine: it calls `step()` while requests exist, so vLLM's scheduler batches every
concurrent `generate()` continuously. The event loop never waits for a step: `generate()` puts
its request on a thread-safe queue and awaits a future; the driver drains that queue (adding new
requests, aborting those of cancelled callers) before every `step()`, and hands results and
`add_request` errors back with `loop.call_soon_threadsafe`. A lock serialises the driver's
drain-and-step with weight reloads, prefix-cache resets and shutdown, which run in worker threads,
never on the event loop.

LoRA (an engine started with `lora_engine_args`): `update_adapter` writes the adapter into a
directory of its own and registers it under a new LoRA id (one per policy version) at the same
safe point between steps; every request added from then on carries that adapter. Requests already
running finish on the adapter they started with (their Generation says so), and an old adapter is
removed, directory and all, once its last request is done. vLLM keys its prefix cache by adapter,
so each version has its own cached prefixes without a reset.

Sleep mode (``sleep_mode=True``, CUDA only): `sleep()` first holds new requests (the driver keeps
them, in order, instead of adding them), lets the running ones finish, then calls vLLM's
`sleep(level=1)` at a safe point: the KV cache is dropped and the weights go to host memory.
`wake()` brings them back and releases the held requests. Level 1, not 2: level 2 discards buffers
that are not checkpoint weights (the rotary cache), which a weight push would not restore.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any

from arl.engine.base import (
    EngineError,
    Generation,
    InvalidPromptError,
    LoRAAdapter,
    SamplingParams,
)
from arl.engine.handoff import Abort, Add, Pending, fail_queued, post, release, take_all
from arl.engine.vllm_args import VLLMBackend, in_engine_dtype, to_generations, to_vllm_params, to_vllm_prompt
from arl.engine.vllm_lora import ServedAdapter

_log = logging.getLogger(__name__)


# In-process engines alive in this process. vLLM's EngineCore.shutdown() tears down the
# process-global distributed state (model-parallel groups) that every in-process engine shares,
# so only the last engine to close may run that teardown; the others would be left broken.
_LIVE: set[int] = set()
_LIVE_LOCK = threading.Lock()


def _shutdown_core(engine: Any, last: bool) -> None:
    import vllm.v1.engine.core as core

    if last:
        engine.engine_core.shutdown()
        return
    teardown = core.cleanup_dist_env_and_memory
    core.cleanup_dist_env_and_memory = lambda *args, **kwargs: None
    try:
        engine.engine_core.shutdown()
    finally:
        core.cleanup_dist_env_and_memory = teardown


class _CacheCounter:
    """Adds up vLLM's per-step prefix-cache statistics (tokens queried, tokens hit), recorded on
    the driver thread through vLLM's stat-logger hook; read from any thread (plain ints)."""

    def __init__(self) -> None:
        self.queries = 0
        self.hits = 0

    def factory(self, vllm_config: Any, engine_index: int = 0) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        counter = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                       engine_idx: int = 0) -> None:
                stats = getattr(scheduler_stats, "prefix_cache_stats", None)
                if stats is not None:
                    counter.queries += int(stats.queries)
                    counter.hits += int(stats.hits)

            def log_engine_initialized(self) -> None:
                pass

        return _Logger(vllm_config, engine_index)


class VLLMEngine(VLLMBackend):
    """vLLM `LLMEngine` fully in-process, continuously batching every concurrent `generate()`
    (options: `VLLMBackend`'s)."""

    name = "vllm"

    def _start(self, kw: dict[str, Any]) -> Any:
        from vllm import EngineArgs, LLMEngine

        self._cache = _CacheCounter()
        self._steps = 0  # engine steps taken, and seconds spent in them (driver thread writes, anyone reads)
        self._busy_s = 0.0
        self._engine = LLMEngine.from_engine_args(EngineArgs(**kw), stat_loggers=[self._cache.factory])
        return self._engine

    def _serve_requests(self) -> None:
        """The driver thread and what it shares with the event loop."""
        # Every call into LLMEngine holds this lock. The event loop never takes it: the driver's
        # drain-and-step, weight reloads, prefix-cache resets and shutdown do (all off the loop).
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue[Add | Abort] = queue.SimpleQueue()  # loop -> driver
        self._work = threading.Event()  # set after every put on the inbox, and on shutdown
        self._stop = False
        self._pending: dict[str, Pending] = {}  # requests added to the engine; driver-owned
        self._ids = itertools.count()
        self._dead: BaseException | None = None
        # self._adapter (VLLMBackend): what new requests are served with; set under the lock
        self._retired: list[ServedAdapter] = []  # replaced adapters, removed once idle (driver thread)
        self._hold = False  # sleep() under way or done: new requests wait in _held (driver-owned)
        self._held: list[Add] = []
        self._drained = threading.Event()  # set by the driver once held and nothing runs any more
        self._thread = threading.Thread(target=self._drive, name="arl-vllm-driver", daemon=True)
        self._thread.start()
        with _LIVE_LOCK:
            _LIVE.add(id(self))

    # -- driver thread -----------------------------------------------------------------------------
    def _drive(self) -> None:
        while not self._stop:
            with self._lock:
                try:
                    self._drain()  # new requests and aborts join before the next step
                    if self._retired:
                        self._remove_idle_adapters()
                    busy = self._engine.has_unfinished_requests()
                    outputs = []
                    if busy:
                        started = time.perf_counter()
                        outputs = self._engine.step()
                        self._steps += 1
                        self._busy_s += time.perf_counter() - started
                except BaseException as exc:  # the engine is broken: fail every waiter
                    self._dead = exc  # first, so a generate() racing with this fails itself
                    self._fail_all(EngineError(f"vLLM engine step failed: {exc!r}"))
                    return
            for out in outputs:
                if out.finished:
                    self._resolve(out)
            if self._hold and not self._pending:
                self._drained.set()  # sleep() may go ahead: nothing runs, new requests are held
            if not busy:
                # Idle: sleep until generate() puts work. Clear before looking at the inbox: a put
                # after the look sets the event again, so no request waits for the timeout.
                self._work.clear()
                if self._inbox.empty() and not self._stop:
                    self._work.wait(timeout=0.5)

    def _drain(self) -> None:
        """Apply everything the event loop queued (driver thread, lock held)."""
        cmds = take_all(self._inbox)
        if self._held and not self._hold:  # woken up: what waited goes first, in order
            cmds, self._held = self._held + cmds, []
        if not cmds:
            return
        dropped = {c.rid for c in cmds if isinstance(c, Abort)}
        for i, cmd in enumerate(cmds):
            try:
                if isinstance(cmd, Abort):
                    pending = self._pending.pop(cmd.rid, None)
                    if pending is not None:  # added earlier, still running
                        self._abort(cmd.rid)
                        release(pending)
                    else:  # finished already (its result is ignored), held, or dropped below
                        self._held = [h for h in self._held if h.rid != cmd.rid]
                elif cmd.rid in dropped:  # cancelled while still queued: never added
                    continue
                elif self._hold:  # the engine sleeps or is about to: the request waits for wake()
                    self._held.append(cmd)
                else:
                    self._add(cmd)
            except BaseException as exc:  # the driver dies: these were taken off the inbox already
                err = EngineError(f"vLLM engine failed: {exc!r}")
                for rest in cmds[i:]:
                    if isinstance(rest, Add) and rest.rid not in self._pending:
                        post(rest.pending, err)
                raise

    def _abort(self, rid: str) -> None:
        try:
            self._engine.abort_request([rid])
        except Exception:  # its output is ignored anyway; it runs on until it finishes at worst
            _log.warning("vLLM failed to abort request %s", rid, exc_info=True)

    def _add(self, cmd: Add) -> None:
        adapter = self._adapter
        lora = {"lora_request": adapter.request} if adapter is not None else {}
        try:
            self._engine.add_request(cmd.rid, to_vllm_prompt(cmd.prompt, cmd.pending.images), cmd.params, **lora)
        except Exception as exc:  # this request only: its caller gets the error, the engine serves on
            post(cmd.pending, _rejected(exc))
        else:
            if adapter is not None:  # sampled by this adapter's policy, whatever generate() saw
                adapter.in_flight += 1
                cmd.pending.adapter, cmd.pending.version = adapter, adapter.version
            self._pending[cmd.rid] = cmd.pending

    def _remove_idle_adapters(self) -> None:
        """Unload replaced adapters no request runs on any more (driver thread, lock held)."""
        for served in [a for a in self._retired if a.in_flight <= 0]:
            self._retired.remove(served)
            try:
                self._engine.remove_lora(served.request.lora_int_id)
            except Exception:  # it only costs memory until the engine closes
                _log.warning("vLLM failed to remove LoRA adapter %s", served.request.lora_name, exc_info=True)
            self._adapters.discard(served)

    def _resolve(self, out: Any) -> None:
        pending = self._pending.pop(out.request_id, None)
        if pending is None:  # aborted by a cancelled caller
            return
        release(pending)
        try:
            result: Any = to_generations(out, pending.prompt_len, pending.version, images=bool(pending.images))
        except EngineError as exc:
            result = exc
        except Exception as exc:  # never let a malformed output kill the driver
            result = EngineError(f"could not read vLLM's output: {exc!r}")
        post(pending, result)

    def _fail_all(self, exc: BaseException) -> None:
        """Fail every added and every still-queued request (the driver is gone or going)."""
        pending, self._pending = self._pending, {}
        for p in pending.values():
            release(p)
            post(p, exc)
        held, self._held = self._held, []
        for cmd in held:
            post(cmd.pending, exc)
        fail_queued(self._inbox, exc)

    # -- facade ----------------------------------------------------------------------------------
    async def _generate_n(self, prompt: list[int], params: SamplingParams, rendered: Any = None) -> list[Generation]:
        if self._dead is not None:
            raise EngineError(f"vLLM engine is dead after an earlier failure: {self._dead!r}")
        ran = len(rendered.input_ids) if rendered is not None else len(prompt)  # the context it takes
        try:
            vparams = to_vllm_params(params, self.max_new_tokens(ran, params), bad_words=self.bad_words)
        except Exception as exc:
            raise _rejected(exc) from exc
        rid = f"arl-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        images = tuple(rendered.images) if rendered is not None else ()
        self._inbox.put(Add(rid, prompt, vparams, Pending(loop, future, len(prompt), self.policy_version, images=images)))
        self._work.set()
        if self._dead is not None or self._stop:
            # The driver died or stopped after the check above and may have drained the inbox for
            # the last time before this put: fail what is left (this request included) ourselves.
            fail_queued(self._inbox, EngineError("vLLM engine stopped before the request started"))
        try:
            return await future
        except asyncio.CancelledError:
            self._inbox.put(Abort(rid))
            self._work.set()
            raise

    async def _update_weights(self, named_tensors: Iterable[tuple[str, Any]], keep_kv: bool = False) -> None:
        if self._dead is not None:  # a failed engine core cannot load weights either: say so
            raise EngineError(f"vLLM engine is dead after an earlier failure: {self._dead!r}")
        self._check_awake()
        await asyncio.to_thread(self._reload, named_tensors, keep_kv)

    def _reload(self, named_tensors: Iterable[tuple[str, Any]], keep_kv: bool = False) -> None:
        # reload_weights goes through the model's own load_weights with checkpoint names (HF
        # format) and re-runs the CPU backend's weight repacking; a raw model.load_weights does not.
        # Runs in a worker thread; the driver waits for the lock between steps, and requests that
        # arrive meanwhile wait in the inbox (their policy_version is the one at generate() time).
        with self._lock:
            self._engine.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": iter(list(in_engine_dtype(named_tensors, self._dtype))),
                        "is_checkpoint_format": True},
            )
            if not keep_kv:  # cached KV was computed by the old weights (keep_kv: reused, stale, on purpose)
                self._engine.reset_prefix_cache()
            if self.image_renderer is not None:  # image features computed by the old vision tower are stale
                self._engine.reset_encoder_cache()
            self._serve(None)  # new weights are a new policy: an adapter trained on the old base is dropped

    async def _update_adapter(self, adapter: LoRAAdapter) -> None:
        if not self.lora_enabled:  # started without LoRA: the merged weights instead
            await super()._update_adapter(adapter)
            return
        if self._dead is not None:
            raise EngineError(f"vLLM engine is dead after an earlier failure: {self._dead!r}")
        self._check_awake()
        await asyncio.to_thread(self._push_adapter, adapter, self.policy_version + 1)

    def _push_adapter(self, adapter: LoRAAdapter, version: int) -> None:
        # The files are written while the engine steps on; only the registration waits for a safe point.
        served = self._adapters.write(adapter, version)
        try:
            with self._lock:
                if not self._engine.add_lora(served.request):
                    raise EngineError(f"vLLM refused LoRA adapter {served.request.lora_name}")
                self._serve(served)
        except EngineError:
            self._adapters.discard(served)
            raise
        except Exception as exc:
            self._adapters.discard(served)
            raise EngineError(f"vLLM could not load the LoRA adapter: {exc!r}") from exc
        self._work.set()  # wake an idle driver to unload the replaced adapter

    def _serve(self, served: ServedAdapter | None) -> None:
        """Serve new requests with `served` (None: the base weights); retire the adapter it replaces."""
        if self._adapter is not None:
            self._retired.append(self._adapter)
        self._adapter = served

    # -- sleep mode --------------------------------------------------------------------------------
    async def sleep(self) -> None:
        """Free the engine's GPU memory until `wake()` (an engine started with ``sleep_mode``; a no-op
        otherwise): waits for the running requests to finish; requests made meanwhile wait for
        `wake()`. The prefix cache does not survive (vLLM drops the KV cache)."""
        self._check_open()
        if self.sleep_mode and not self._asleep:
            await asyncio.to_thread(self._sleep)

    def _sleep(self) -> None:
        self._hold = True
        self._work.set()  # an idle driver looks once more and reports it is drained
        while not self._drained.wait(timeout=0.1):
            if self._dead is not None or self._stop:
                raise EngineError("vLLM engine stopped while going to sleep")
        with self._lock:
            self._engine.reset_prefix_cache()
            self._engine.sleep(level=1)
            self._asleep = True

    async def wake(self) -> None:
        """Undo `sleep()`: weights and KV cache back on the GPU, held requests start."""
        self._check_open()
        if self._asleep or self._hold:
            await asyncio.to_thread(self._wake)

    def _wake(self) -> None:
        with self._lock:
            if self._asleep:
                self._engine.wake_up()
                self._asleep = False
            self._hold = False
            self._drained.clear()
        self._work.set()  # the driver adds the held requests

    async def loaded_adapters(self) -> set[int]:
        """LoRA ids vLLM holds now (the current adapter's, and replaced ones still finishing requests)."""
        self._check_open()
        if not self.lora_enabled:
            return set()

        def ids() -> set[int]:
            with self._lock:
                return set(self._engine.list_loras())

        return await asyncio.to_thread(ids)

    @property
    def adapter_version(self) -> int | None:
        """The policy version of the adapter new requests get (None: the base weights)."""
        return None if self._adapter is None else self._adapter.version

    def engine_stats(self) -> dict[str, float]:
        return {"prefix_cache_queries": self._cache.queries, "prefix_cache_hits": self._cache.hits,
                "engine_steps": self._steps, "engine_busy_s": self._busy_s}

    def reset_prefix_cache(self) -> bool:
        """Drop vLLM's prefix cache (waits for the current step: call it off the event loop)."""
        with self._lock:
            return bool(self._engine.reset_prefix_cache())

    async def _close(self) -> None:
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._stop = True
        self._work.set()
        self._thread.join(timeout=30)
        with _LIVE_LOCK:
            _LIVE.discard(id(self))
            last = not _LIVE
        with self._lock:
            self._fail_all(EngineError("engine closed while the request was running"))
            _shutdown_core(self._engine, last)
        self._adapters.close()


def _rejected(exc: Exception) -> EngineError:
    """vLLM's refusal of one request -> arl typed error (its input validation -> InvalidPromptError)."""
    from vllm.exceptions import VLLMClientError  # VLLMValidationError is not a ValueError

    if isinstance(exc, ValueError | VLLMClientError):
        err: EngineError = InvalidPromptError(str(exc))
    else:
        err = EngineError(f"vLLM rejected the request: {exc!r}")
    err.__cause__ = exc
    return err
