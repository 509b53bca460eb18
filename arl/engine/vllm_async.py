"""vLLM's own async engine (`AsyncLLM`) behind the arl engine contract.

Shape and why:

- `AsyncLLM` always runs its engine core in a child process that vLLM manages (with
  `VLLM_ENABLE_V1_MULTIPROCESSING=0` the CPU worker is folded into that child: 2 processes).
- Construction does not need a running event loop (vLLM starts its output-handler tasks lazily on
  the first request), but from then on those tasks, its zmq.asyncio sockets and its queues belong
  to the loop that first used them: an `AsyncLLM` cannot serve a second loop. arl code calls
  `asyncio.run` more than once in a process (tests, scripts, the sync trainer), so the engine owns
  one private event-loop thread: `AsyncLLM` is built and always driven there, and `generate()`
  bridges from whatever loop awaits it with `run_coroutine_threadsafe`. This makes
  `make_engine(backend="vllm-async")` work the same from sync code and inside a running loop
  (where, like the in-process backend, it blocks that loop for the start-up), and it keeps vLLM's
  output processing off the agents' loop. The price is one thread hop per request.
- Cancelling the task that awaits `generate()` cancels the bridged task, whose `async for` over
  `AsyncLLM.generate` then aborts the request in the engine core (vLLM aborts on
  CancelledError/GeneratorExit).
- Weights cross the process boundary as safetensors bytes: tensors inside `collective_rpc`'s
  untyped args do not survive vLLM's msgpack hop, bytes do, and a plain callable would need
  `VLLM_ALLOW_INSECURE_SERIALIZATION=1` (pickle). `WeightSyncExtension` is mixed into vLLM's
  worker class (`worker_extension_cls`) and feeds the bytes to the worker's `reload_weights`.
- LoRA (started with `lora_engine_args`): `update_adapter` writes the adapter's peft directory
  (the child process reads it from disk) and registers it with `add_lora` under a new id per
  policy version; new requests carry it, running ones finish on the one they started with, and a
  replaced adapter is removed once its last request is done. All of that bookkeeping runs on the
  engine loop, so it needs no lock.
- Sleep mode (``sleep_mode=True``, CUDA only): `sleep()` holds new requests on the engine loop,
  waits for the running ones, then calls `AsyncLLM.sleep(level=1)` (KV cache dropped, weights to
  host memory); `wake()` undoes it and releases the held requests. Off by default: for small
  models sleeping costs more than it saves (docs/reference.md §5).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from arl.engine.base import (
    EngineClosedError,
    EngineError,
    Generation,
    InvalidPromptError,
    LoRAAdapter,
    SamplingParams,
)
from arl.engine.vllm_args import VLLMBackend, in_engine_dtype, to_generations, to_vllm_params, to_vllm_prompt
from arl.engine.vllm_lora import ServedAdapter

T = TypeVar("T")
_log = logging.getLogger(__name__)

EXTENSION = f"{__name__}.WeightSyncExtension"
_SHUTDOWN_TIMEOUT_S = 30.0


class WeightSyncExtension:
    """Mixed into vLLM's worker class in the engine-core child process (`worker_extension_cls`).

    A new state dict arrives as safetensors chunks (msgpack caps one binary at 4 GiB, and
    chunks bound the extra memory of each message), staged until `arl_load_staged` loads them
    all at once. vLLM refuses extension attributes that collide with the worker's: hence `arl_`.
    """

    def arl_stage_safetensors(self, blob: bytes, first: bool) -> int:
        if first or not hasattr(self, "_arl_staged"):  # drop leftovers of an interrupted update
            self._arl_staged: list[bytes] = []
        self._arl_staged.append(bytes(blob))
        return len(self._arl_staged)

    def arl_load_staged(self) -> int:
        from safetensors.torch import load

        blobs, self._arl_staged = getattr(self, "_arl_staged", []), []
        tensors = [item for blob in blobs for item in load(blob).items()]
        # reload_weights runs the model's own load_weights on checkpoint names and redoes the CPU
        # backend's weight repacking; a raw model.load_weights leaves repacked layers stale.
        self.reload_weights(  # type: ignore[attr-defined]  # provided by the vLLM worker
            weights_iterator=iter(tensors), is_checkpoint_format=True
        )
        return len(tensors)


def chunk_state(
    named_tensors: Iterable[tuple[str, Any]], max_bytes: int
) -> Iterator[list[tuple[str, Any]]]:
    """Group (name, tensor) pairs into chunks of at most `max_bytes` (or one oversized tensor)."""
    chunk: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if chunk and size + nbytes > max_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += nbytes
    if chunk:
        yield chunk


def serialize_state(named_tensors: Iterable[tuple[str, Any]]) -> bytes:
    """(name, tensor) pairs -> safetensors bytes.

    safetensors refuses tensors that share storage (the tiny model ties lm_head to the
    embedding), so a tensor whose storage was already seen is cloned.
    """
    from safetensors.torch import save

    seen: set[int] = set()
    state: dict[str, Any] = {}
    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(ptr)
        state[name] = t
    return save(state)


class AsyncVLLMEngine(VLLMBackend):
    """vLLM `AsyncLLM` (engine core in a child process), driven from a private event-loop thread
    (options: `VLLMBackend`'s)."""

    name = "vllm-async"

    def _start(self, kw: dict[str, Any]) -> Any:
        if self.max_images:  # a VLM: the engine core, another process, needs arl's vLLM plugin
            from arl.engine.vllm_vision import check_plugin

            check_plugin()
        # A user-supplied extension must subclass WeightSyncExtension or update_weights breaks.
        kw.setdefault("worker_extension_cls", EXTENSION)
        # Stats are only consumed by vLLM's loggers; the library never logs, so skip collecting.
        kw.setdefault("disable_log_stats", True)

        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()  # in-flight requests, touched on the loop thread
        self._awake = asyncio.Event()  # cleared by sleep(): new requests wait (engine loop only)
        self._awake.set()
        self._running = 0  # requests inside AsyncLLM.generate, and an event for "none" (engine loop)
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self.weight_chunk_bytes = 256 * 2**20  # per update_weights message to the worker
        self._owns_tracker = not _resource_tracker_running()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="arl-vllm-async-loop", daemon=True
        )
        self._thread.start()
        try:
            # Built on the private loop so vLLM's tasks bind to it, even if a loop runs here.
            self._llm = self._submit(self._build(kw)).result()
        except BaseException:
            self._stop_loop()
            if self._owns_tracker:
                _stop_resource_tracker()
            raise
        return self._llm  # self._adapter (VLLMBackend) is read and written on the engine loop only

    @staticmethod
    async def _build(kw: dict[str, Any]) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))

    @property
    def llm(self) -> Any:
        """The underlying `AsyncLLM`. Await its coroutines through `on_engine_loop` only."""
        return self._llm

    async def on_engine_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` (e.g. one of `self.llm`'s coroutines) on the engine loop; await its result.

        Cancelling the caller cancels `coro` on the engine loop too (future chaining).
        """
        return await asyncio.wrap_future(self._submit(coro))

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closing:  # the loop may already be stopped: a coroutine sent now would never run
            coro.close()
            raise EngineClosedError(f"{self.name} engine is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    # -- generate ---------------------------------------------------------------------------------
    async def _generate_n(self, prompt: list[int], params: SamplingParams, rendered: Any = None) -> list[Generation]:
        ran = len(rendered.input_ids) if rendered is not None else len(prompt)  # the context it takes
        try:
            vparams = to_vllm_params(params, self.max_new_tokens(ran, params), bad_words=self.bad_words)
        except Exception as exc:
            raise _translate(exc) from exc
        rid = f"arl-async-{next(self._ids)}"
        version = self.policy_version
        images = tuple(rendered.images) if rendered is not None else ()
        try:
            out, adapter_version = await self.on_engine_loop(self._run(rid, to_vllm_prompt(prompt, images), vparams))
        except EngineError:
            raise
        except Exception as exc:
            raise _translate(exc) from exc
        return to_generations(out, len(prompt), version if adapter_version is None else adapter_version,
                              images=bool(images))

    async def _run(self, rid: str, prompt: dict[str, Any], vparams: Any) -> tuple[Any, int | None]:
        """On the engine loop: drive one request to its final output (FINAL_ONLY: one item), on the
        current adapter if there is one; returns the output and that adapter's policy version."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._awake.wait()  # sleep mode: held until wake()
        except asyncio.CancelledError:
            self._tasks.discard(task)
            if self._closing:
                raise EngineError("engine closed while the request was waiting for wake()") from None
            raise
        adapter = self._adapter
        lora = {"lora_request": adapter.request} if adapter is not None else {}
        if adapter is not None:
            adapter.in_flight += 1
        final = None
        self._running += 1
        self._idle.clear()
        try:
            async for out in self._llm.generate(prompt, vparams, rid, **lora):
                final = out
        except asyncio.CancelledError:
            if self._closing:  # cancelled by close(), not by the caller: report it as an error
                raise EngineError("engine closed while the request was running") from None
            raise
        finally:
            self._tasks.discard(task)
            self._running -= 1
            if self._running == 0:
                self._idle.set()
            if adapter is not None:
                adapter.in_flight -= 1
                if adapter is not self._adapter and adapter.in_flight == 0 and not self._closing:
                    await self._remove_adapter(adapter)
        if final is None or not final.finished:
            raise EngineError(f"vLLM ended request {rid} without a final output")
        return final, None if adapter is None else adapter.version

    # -- weights ----------------------------------------------------------------------------------
    async def _update_weights(self, named_tensors: Iterable[tuple[str, Any]], keep_kv: bool = False) -> None:
        self._check_awake()
        # Iterating the caller's tensors and serializing them is CPU work: keep it off both loops.
        try:
            await asyncio.to_thread(self._push_weights, named_tensors, keep_kv)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"vLLM weight update failed: {exc!r}") from exc

    def _push_weights(self, named_tensors: Iterable[tuple[str, Any]], keep_kv: bool = False) -> None:
        """On a worker thread: stream safetensors chunks to the worker, then load them at once."""
        first = True
        for chunk in chunk_state(in_engine_dtype(named_tensors, self._dtype), self.weight_chunk_bytes):
            blob = serialize_state(chunk)
            self._submit(self._llm.collective_rpc("arl_stage_safetensors", args=(blob, first))).result()
            first = False
        if not first:
            self._submit(self._load_staged(keep_kv)).result()

    async def _load_staged(self, keep_kv: bool = False) -> None:
        await self._llm.collective_rpc("arl_load_staged")
        # Cached KV blocks were computed by the old weights. Returns False while running requests
        # hold blocks (those keep their stale prefix; new ones recompute). keep_kv: reused on purpose.
        if not keep_kv:
            await self._llm.reset_prefix_cache()
        if self.image_renderer is not None:  # image features computed by the old vision tower are stale
            await self._llm.reset_encoder_cache()
        await self._serve(None)  # new weights are a new policy: an adapter trained on the old base is dropped

    # -- LoRA adapters ----------------------------------------------------------------------------
    async def _update_adapter(self, adapter: LoRAAdapter) -> None:
        if not self.lora_enabled:  # started without LoRA: the merged weights instead
            await super()._update_adapter(adapter)
            return
        self._check_awake()
        served = await asyncio.to_thread(self._adapters.write, adapter, self.policy_version + 1)
        try:
            await self.on_engine_loop(self._add_adapter(served))
        except BaseException as exc:
            self._adapters.discard(served)
            if isinstance(exc, EngineError | asyncio.CancelledError):
                raise
            raise EngineError(f"vLLM could not load the LoRA adapter: {exc!r}") from exc

    async def _add_adapter(self, served: ServedAdapter) -> None:
        """On the engine loop: load `served` into the engine core, then serve new requests with it."""
        if not await self._llm.add_lora(served.request):
            raise EngineError(f"vLLM refused LoRA adapter {served.request.lora_name}")
        await self._serve(served)

    async def _serve(self, served: ServedAdapter | None) -> None:
        """On the engine loop: new requests get `served` (None: the base weights); the replaced
        adapter goes now if nothing runs on it, else when its last request ends (`_run`)."""
        old, self._adapter = self._adapter, served
        if old is not None and old.in_flight == 0:
            await self._remove_adapter(old)

    async def _remove_adapter(self, served: ServedAdapter) -> None:
        try:
            await self._llm.remove_lora(served.request.lora_int_id)
        except Exception:  # it only costs memory until the engine closes
            _log.warning("vLLM failed to remove LoRA adapter %s", served.request.lora_name, exc_info=True)
        self._adapters.discard(served)

    # -- sleep mode -------------------------------------------------------------------------------
    async def sleep(self) -> None:
        """Free the engine's GPU memory until `wake()` (an engine started with ``sleep_mode``; a no-op
        otherwise): waits for the running requests to finish; requests made meanwhile wait for
        `wake()`. The prefix cache does not survive (vLLM drops the KV cache)."""
        self._check_open()
        if self.sleep_mode and not self._asleep:
            await self.on_engine_loop(self._sleep())

    async def _sleep(self) -> None:
        self._awake.clear()
        await self._idle.wait()
        await self._llm.reset_prefix_cache()
        await self._llm.sleep(level=1)
        self._asleep = True

    async def wake(self) -> None:
        """Undo `sleep()`: weights and KV cache back on the GPU, held requests start."""
        self._check_open()
        if self._asleep or not self._awake.is_set():
            await self.on_engine_loop(self._wake())

    async def _wake(self) -> None:
        if self._asleep:
            await self._llm.wake_up()
            self._asleep = False
        self._awake.set()

    async def loaded_adapters(self) -> set[int]:
        """LoRA ids the engine core holds now (the current adapter's, and replaced ones still
        finishing requests)."""
        self._check_open()
        return set(await self.on_engine_loop(self._llm.list_loras())) if self.lora_enabled else set()

    async def reset_prefix_cache(self) -> bool:
        self._check_open()
        return bool(await self.on_engine_loop(self._llm.reset_prefix_cache()))

    # -- shutdown ---------------------------------------------------------------------------------
    async def _close(self) -> None:
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._closing = True  # no new work from here on
        try:
            shutdown = asyncio.run_coroutine_threadsafe(self._shutdown_on_loop(), self._loop)
            shutdown.result(timeout=3 * _SHUTDOWN_TIMEOUT_S)
        finally:
            self._stop_loop()
            self._adapters.close()
            if self._owns_tracker:
                _stop_resource_tracker()

    async def _shutdown_on_loop(self) -> None:
        """On the engine loop, so vLLM closes its sockets and cancels its tasks right here."""
        try:
            # Fail the in-flight requests while the engine core still answers their aborts: after
            # AsyncLLM.shutdown() vLLM's output handler is gone and they would wait forever.
            mine = list(self._tasks)
            for t in mine:
                t.cancel()
            if mine:
                await asyncio.wait(mine, timeout=_SHUTDOWN_TIMEOUT_S)
        finally:
            # Terminates and joins the engine-core child. Blocks this loop: nothing else needs it.
            self._llm.shutdown(timeout=_SHUTDOWN_TIMEOUT_S)
        # Let vLLM's cancelled tasks finish so none is destroyed pending when the loop closes.
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        if rest:
            await asyncio.wait(rest, timeout=_SHUTDOWN_TIMEOUT_S)
        await self._loop.shutdown_asyncgens()

    def _stop_loop(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=_SHUTDOWN_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()


def _translate(exc: BaseException) -> EngineError:
    """vLLM exception -> arl typed error: request validation -> InvalidPromptError."""
    from vllm.exceptions import VLLMClientError
    from vllm.v1.engine.exceptions import EngineGenerateError

    # AsyncLLM.generate wraps unexpected errors (a ValueError from input processing among them)
    # in EngineGenerateError; the cause says what went wrong.
    cause = exc.__cause__ if isinstance(exc, EngineGenerateError) and exc.__cause__ else exc
    if isinstance(cause, ValueError | VLLMClientError):
        return InvalidPromptError(str(cause))
    return EngineError(f"vLLM request failed: {cause!r}")


# vLLM's CPU platform forces the `spawn` start method (so a script must guard its entry point with
# `if __name__ == "__main__":`), and spawning starts multiprocessing's resource-tracker process,
# which otherwise outlives the engine until interpreter exit. When this engine started it, close()
# stops it (multiprocessing restarts it on demand).
def _resource_tracker_running() -> bool:
    from multiprocessing import resource_tracker

    return getattr(resource_tracker._resource_tracker, "_pid", None) is not None


def _stop_resource_tracker() -> None:
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None and _resource_tracker_running():
        stop()
