"""transformers backend: a request-batching queue over our own KV-cached sampling loop.

Why not `model.generate`: we need one `torch.Generator` per sequence (seeded requests must not
depend on what else is in the batch) and the log-prob of each sampled token under the processed
distribution, exactly as vLLM computes them (`logprobs_mode="processed_logprobs"`). The sampler
mirrors vLLM's: temperature, then top-k, then top-p on the renormalised distribution, then the
exponential race `argmax(probs / q)` with `q ~ Exp(1)` drawn from the sequence's generator, so a
seeded request on the tiny model gives the same tokens as vLLM's CPU backend.

Concurrency: `generate()` appends to a queue and awaits a future. One worker task per event loop
takes everything queued (up to `max_batch_size` sequences) and runs it as one left-padded batch in
a dedicated single-thread executor; requests arriving meanwhile wait for the next batch. Weight
updates go through the same executor under the same asyncio lock, so a batch never sees half-loaded
weights and each Generation carries the policy version it was actually sampled with.

Images (a Qwen2-VL-family model: its config has a ``vision_config``): the engine loads it with
``AutoModelForImageTextToText`` and renders image prompts with `arl.engine.images.ImageRenderer`.
Image and text requests share a batch: the prefill gets every image row's pixel values (the
renderer's) and the 3-D rotary positions the model's ``get_rope_index`` computes from the
left-padded expanded ids, each decode step one past the row's largest position on all three axes;
exactly what a trainer's forward over prompt + completion computes.

LoRA: `update_adapter` injects the adapter's LoRA layers into the model with peft (once; later
pushes only copy the A and B matrices), so the engine computes base + scale * B @ A exactly as the
trainer's peft model does. `update_weights` then loads base weights and switches the adapter off.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import torch

from arl.engine.base import (
    BaseEngine,
    EngineClosedError,
    EngineError,
    Generation,
    LoRAAdapter,
    SamplingParams,
)
from arl.engine.handoff import settle

_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}


@attrs.define(eq=False)
class _Request:
    prompt: list[int]
    params: SamplingParams
    generators: list[torch.Generator]  # one per completion
    max_new: int
    stop: frozenset[int]
    future: asyncio.Future
    version: int = 0
    cancelled: bool = False  # set by the awaiting task; read by the batch thread to drop its rows
    rendered: Any = None  # an image request's RenderedPrompt (arl.engine.images)


@attrs.define(eq=False)
class _Row:
    """One sequence being generated (a request with n > 1 has n rows)."""

    req: _Request
    index: int
    generator: torch.Generator
    tokens: list[int] = attrs.Factory(list)
    logprobs: list[float] = attrs.Factory(list)
    finish: str | None = None


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' weight-loading progress bar: the library never prints."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


class HFEngine(BaseEngine):
    """transformers model behind a batching queue; greedy output equals vLLM's on fp32."""

    name = "hf"

    def __init__(
        self,
        model_path: str,
        *,
        max_model_len: int = 2048,
        seed: int = 0,
        dtype: str = "float32",
        max_batch_size: int = 32,
        device: str | None = None,
    ):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        from arl.models.tiny_vl import has_vision_tower

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype == "auto":
            torch_dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        elif dtype in _DTYPES:
            torch_dtype = _DTYPES[dtype]
        else:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)} or 'auto'")
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        vision = has_vision_tower(AutoConfig.from_pretrained(model_path))
        auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        with _quiet_transformers():
            model = auto.from_pretrained(model_path, dtype=torch_dtype)
        self.model = model.to(self.device).eval()
        config = self.model.config.get_text_config()  # a VLM's vocabulary and context are its text model's
        limit = getattr(config, "max_position_embeddings", None)
        if limit is not None and max_model_len > limit:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={limit}")
        # Logits cover the embedding rows (config.vocab_size); the tokenizer may know fewer ids.
        super().__init__(tokenizer, max_model_len, config.vocab_size)
        self.max_batch_size = int(max_batch_size)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._seed_rng = random.Random(seed)  # seeds for requests without their own
        self._queue: collections.deque[_Request] = collections.deque()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arl-hf")
        self._stopping = False  # read by the batch thread: abort the running batch on close()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None  # one batch or one weight update at a time
        self._lora_config: dict[str, Any] | None = None  # the injected adapter's shape, once injected
        if vision:
            from arl.engine.images import ImageRenderer
            from arl.models.tiny_vl import mask_logits

            self.image_renderer = ImageRenderer(model_path, tokenizer)
            mask_logits(self.model, self.forbidden_token_ids)  # never sampled; log-probs of the masked distribution

    # -- facade ------------------------------------------------------------------------------------
    async def _generate_images_n(self, rendered: Any, params: SamplingParams) -> list[Generation]:
        gens = await self._generate_n(list(rendered.input_ids), params, rendered)
        return [attrs.evolve(g, prompt_token_ids=rendered.input_ids) for g in gens]

    async def _generate_n(self, prompt: list[int], params: SamplingParams, rendered: Any = None) -> list[Generation]:
        self._ensure_worker()
        assert self._loop is not None and self._wakeup is not None
        if params.seed is not None:
            seeds = [params.seed + i for i in range(params.n)]  # what vLLM gives n > 1 children
        else:
            seeds = [self._seed_rng.getrandbits(63) for _ in range(params.n)]
        try:  # built here so that a bad seed fails this request only, not its whole batch
            generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        except (ValueError, RuntimeError, OverflowError) as exc:
            raise EngineError(f"cannot seed a generator with {params.seed!r}: {exc}") from exc
        req = _Request(
            prompt, params, generators, self.max_new_tokens(len(prompt), params),
            frozenset(self.stop_ids(params)), self._loop.create_future(), rendered=rendered,
        )
        self._queue.append(req)
        self._wakeup.set()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True  # the running batch drops its rows; a queued one is skipped
            raise

    async def _update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        tensors = list(named_tensors)
        self._ensure_worker()
        assert self._lock is not None and self._loop is not None
        # The lock makes a running batch finish first and holds the next one until BaseEngine has
        # bumped policy_version (that happens right after we return, before the worker resumes).
        async with self._lock:
            await self._loop.run_in_executor(self._executor, self._load, tensors)

    async def _update_adapter(self, adapter: LoRAAdapter) -> None:
        self._ensure_worker()
        assert self._lock is not None and self._loop is not None
        async with self._lock:  # as for update_weights: between batches, before the version bump
            await self._loop.run_in_executor(self._executor, self._load_adapter, adapter)

    async def _close(self) -> None:
        self._stopping = True
        worker, loop = self._worker, self._loop
        if worker is not None and self._wakeup is not None and loop is asyncio.get_running_loop():
            self._wakeup.set()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        self._fail_queued(EngineClosedError("hf engine closed while the request was waiting"))
        self._executor.shutdown(wait=True)  # the running batch (if any) aborts at its next step

    # -- worker ------------------------------------------------------------------------------------
    def _ensure_worker(self) -> None:
        """Start the batching worker on the running loop (again, if an earlier loop has gone)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._worker is not None and not self._worker.done():
            return
        if self._loop is not loop:  # requests of a dead loop can never be answered
            self._fail_queued(EngineError("the event loop that submitted the request has gone"))
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._lock = asyncio.Lock()
        self._worker = loop.create_task(self._work(), name="arl-hf-batcher")

    async def _work(self) -> None:
        assert self._wakeup is not None and self._lock is not None
        while not self._stopping:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            async with self._lock:
                batch = self._take_batch()
                if not batch:
                    continue
                version = self.policy_version
                loop = asyncio.get_running_loop()
                try:
                    results = await loop.run_in_executor(self._executor, self._run_batch, batch)
                except Exception as exc:  # the batch is lost, the worker keeps serving
                    err = exc if isinstance(exc, EngineError) else EngineError(f"hf batch failed: {exc!r}")
                    for req in batch:
                        settle(req.future, err)
                    continue
            for req, gens in zip(batch, results, strict=True):
                settle(req.future, [attrs.evolve(g, policy_version=version) for g in gens])

    def _take_batch(self) -> list[_Request]:
        """Queued requests, oldest first, up to max_batch_size sequences (at least one request)."""
        batch: list[_Request] = []
        rows = 0
        while self._queue:
            req = self._queue[0]
            if req.cancelled or req.future.done():
                self._queue.popleft()
                continue
            if batch and rows + req.params.n > self.max_batch_size:
                break
            batch.append(self._queue.popleft())
            rows += req.params.n
        return batch

    def _fail_queued(self, exc: BaseException) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        while self._queue:
            req = self._queue.popleft()
            loop = req.future.get_loop()
            if loop is running:
                settle(req.future, exc)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(settle, req.future, exc)

    # -- executor thread ---------------------------------------------------------------------------
    def _load(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        # keep_vars: the live Parameters, so tied weights (lm_head = embed_tokens) are one object and
        # copying into either name updates both.
        state = self.model.state_dict(keep_vars=True)
        if self._lora_config is not None:  # peft moved each adapted weight under `<module>.base_layer.`
            state.update({_hf_name(name): t for name, t in state.items() if ".base_layer." in name})
        unknown = [name for name, _ in tensors if name not in state]
        if unknown:
            raise EngineError(f"update_weights: {len(unknown)} name(s) not in the model: {unknown[:5]}")
        for name, tensor in tensors:
            if tuple(tensor.shape) != tuple(state[name].shape):
                raise EngineError(
                    f"update_weights: {name} has shape {tuple(tensor.shape)}, the model expects "
                    f"{tuple(state[name].shape)}"
                )
        seen: dict[int, tuple[str, torch.Tensor]] = {}
        for name, tensor in tensors:  # tied names share a Parameter: they must not disagree
            first = seen.setdefault(id(state[name]), (name, tensor))
            if first[0] != name and not torch.equal(first[1].to(tensor.device), tensor):
                raise EngineError(f"update_weights: tied weights {first[0]} and {name} were given different values")
        with torch.no_grad():
            for name, tensor in tensors:
                state[name].copy_(tensor)
        if self._lora_config is not None:
            _enable_adapters(self.model, False)

    def _load_adapter(self, adapter: LoRAAdapter) -> None:
        import dataclasses

        from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

        shape = {k: sorted(v) if isinstance(v := adapter.config.get(k), list | set | tuple) else v
                 for k in _LORA_SHAPE}
        if self._lora_config is None:
            known = {f.name for f in dataclasses.fields(LoraConfig)}
            config = LoraConfig(**{k: v for k, v in adapter.config.items() if k in known})
            inject_adapter_in_model(config, self.model, adapter_name="default")
            self.model.eval()
            self._lora_config = shape
        elif shape != self._lora_config:
            raise EngineError(f"update_adapter: this engine serves LoRA adapters shaped {self._lora_config}; "
                              f"got {shape} (a new shape needs a new engine)")
        # peft's file names are relative to a PeftModel (`base_model.model.` + the model's own names).
        tensors = {k.removeprefix("base_model.model."): t for k, t in adapter.tensors.items()}
        result = set_peft_model_state_dict(self.model, tensors, adapter_name="default")
        if result.unexpected_keys:
            raise EngineError(f"update_adapter: {len(result.unexpected_keys)} tensor(s) match no LoRA layer: "
                              f"{result.unexpected_keys[:5]}")
        _enable_adapters(self.model, True)

    @torch.inference_mode()
    def _run_batch(self, batch: list[_Request]) -> list[list[Generation]]:
        rows = [_Row(req, i, gen) for req in batch for i, gen in enumerate(req.generators)]
        live = list(range(len(rows)))  # rows still generating, in batch order
        width = max(len(r.req.prompt) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # left padding: every row's next token is in the last column
            ids[i, width - len(row.req.prompt):] = torch.tensor(row.req.prompt)
            mask[i, width - len(row.req.prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        # Positions count real tokens only, so padding does not shift RoPE; pads get a dummy 1.
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        images = self._image_inputs(rows, width)
        if images:  # 3-D rotary positions (temporal, height, width) for every row, text rows included
            positions, _ = self.model.model.get_rope_index(
                ids, mm_token_type_ids=images.pop("mm_token_type_ids"), image_grid_thw=images["image_grid_thw"],
                attention_mask=mask)
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config.get_text_config())
        while live:
            if self._stopping:
                raise EngineClosedError("hf engine closed while the request was running")
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1,  # only the last position
                **images,
            )
            images = {}  # the prefill has seen the pixels; decode steps see their tokens in the cache
            logits = out.logits[:, -1, :].float()
            tokens, logprobs = self._sample(logits, [rows[i] for i in live])
            keep: list[int] = []
            for k, i in enumerate(live):
                row = rows[i]
                row.tokens.append(tokens[k])
                row.logprobs.append(logprobs[k])
                if tokens[k] in row.req.stop:  # the stop token is kept, as vLLM does
                    row.finish = "stop"
                elif len(row.tokens) >= row.req.max_new:
                    row.finish = "length"
                elif row.req.cancelled:
                    row.finish = "abort"
                else:
                    keep.append(k)
            if len(keep) < len(live):  # drop finished rows from the batch and the KV cache
                if not keep:
                    break
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, positions = mask[index], positions.index_select(positions.dim() - 2, index)
                live = [live[k] for k in keep]
                next_ids = torch.tensor([tokens[k] for k in keep], device=self.device)
            else:
                next_ids = torch.tensor(tokens, device=self.device)
            ids = next_ids[:, None]
            # The next token's position: one past the row's largest (an image's 3-D positions may end
            # below the largest when the prompt ends with it), on every axis; what get_rope_index gives
            # the trainer for text after the prompt.
            positions = positions[:, -1:] + 1 if positions.dim() == 2 else positions.amax(dim=(0, 2), keepdim=True) + 1
            if positions.dim() == 3:
                positions = positions.expand(3, -1, -1)
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
        results: list[list[Generation]] = [[] for _ in batch]
        by_req = {id(req): k for k, req in enumerate(batch)}
        for row in rows:
            assert row.finish is not None
            gen = Generation(row.tokens, row.logprobs, row.finish, len(row.req.prompt))  # type: ignore[arg-type]
            results[by_req[id(row.req)]].append(gen)
        return results

    def _image_inputs(self, rows: list[_Row], width: int) -> dict[str, torch.Tensor]:
        """The prefill's pixels, grids and image-token mask for a left-padded batch ({} without images):
        every image of every row, in row order (the order the model scatters image features in)."""
        if all(row.req.rendered is None for row in rows):
            return {}
        mm = torch.zeros((len(rows), width), dtype=torch.long)
        pixels, grids = [], []
        for i, row in enumerate(rows):
            rendered = row.req.rendered
            if rendered is None:
                continue
            mm[i, width - len(row.req.prompt):] = torch.from_numpy(rendered.image_token_mask.astype("int64"))
            pixels.append(torch.from_numpy(rendered.pixel_values))
            grids.append(torch.from_numpy(rendered.image_grid_thw))
        return {"pixel_values": torch.cat(pixels).to(self.device, self.model.dtype),
                "image_grid_thw": torch.cat(grids).to(self.device), "mm_token_type_ids": mm.to(self.device)}

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> tuple[list[int], list[float]]:
        """Next token and its processed log-prob for each row (vLLM's sampler, one row at a time)."""
        tokens: list[int] = []
        logprobs: list[float] = []
        for k, row in enumerate(rows):
            p = row.req.params
            x = logits[k]
            if p.temperature == 0.0:  # greedy: argmax, log-prob under the raw distribution
                tok = int(torch.argmax(x))
                tokens.append(tok)
                logprobs.append(float(torch.log_softmax(x, dim=-1)[tok]))
                continue
            x = _top_k_top_p(x / p.temperature, p.top_k, p.top_p)
            lp = torch.log_softmax(x, dim=-1)
            probs = torch.softmax(x, dim=-1)
            q = torch.empty_like(probs).exponential_(generator=row.generator)
            tok = int(torch.argmax(probs / q))
            tokens.append(tok)
            logprobs.append(float(lp[tok]))
        return tokens, logprobs


_LORA_SHAPE = ("r", "lora_alpha", "target_modules", "use_rslora", "use_dora", "fan_in_fan_out")


def _hf_name(peft_name: str) -> str:
    """``x.q_proj.base_layer.weight`` (a weight under an injected LoRA layer) -> ``x.q_proj.weight``."""
    return peft_name.replace(".base_layer.", ".")


def _enable_adapters(model: torch.nn.Module, enabled: bool) -> None:
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.enable_adapters(enabled)


def _top_k_top_p(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside top-k, then outside the top-p nucleus of what is left (vLLM's rules:
    ties at the k-th value are kept; the nucleus is the smallest set with mass >= p)."""
    use_k = 0 < top_k < x.numel()
    if not use_k and top_p >= 1.0:
        return x
    x = x.clone()
    if use_k:
        kth = torch.topk(x, top_k).values[-1]
        x[x < kth] = float("-inf")
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=False)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
        drop = cum <= 1.0 - top_p
        drop[-1] = False  # always keep the most likely token
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = x.scatter(0, order, sorted_x)
    return x


