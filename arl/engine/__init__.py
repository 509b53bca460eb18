"""Engines: one contract (`arl.engine.base`), four backends, one factory.

Backends are imported lazily so that `import arl.engine` does not import torch or vLLM.
"""

from __future__ import annotations

from typing import Any

import attrs

from arl.engine.base import (
    BaseEngine,
    Engine,
    EngineClosedError,
    EngineError,
    EngineUnsupportedError,
    Generation,
    InvalidPromptError,
    LoRAAdapter,
    PromptTooLongError,
    SamplingParams,
)

BACKENDS = ("vllm", "vllm-async", "hf", "scripted")


@attrs.define
class EngineConfig:
    """How to build an engine. `model` is a zoo name, a local directory or a hub id."""

    backend: str = attrs.field(default="vllm", validator=attrs.validators.in_(BACKENDS))
    model: str = "tiny"
    max_model_len: int = 2048
    seed: int = 0
    dtype: str = "float32"  # "bfloat16" on a GPU, beside a bf16 policy (optim.precision: bf16)
    kv_cache_memory_bytes: int | None = 256 * 2**20
    max_num_seqs: int = 256
    gpu_memory_utilization: float | None = None
    max_batch_size: int = 32  # hf backend: requests per batched generate()
    scripted: dict[str, Any] = attrs.Factory(dict)  # scripted backend options
    extra: dict[str, Any] = attrs.Factory(dict)  # passed through to vLLM's EngineArgs
    # vLLM on CUDA only: start with vLLM's sleep mode, so `sleep()` frees the engine's GPU memory
    # (KV cache dropped, weights offloaded to host memory) until `wake()`; the trainer then sleeps the
    # engine through every policy update, which gets that memory. It costs a weight round trip per step.
    sleep_mode: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    def __attrs_post_init__(self) -> None:
        if self.sleep_mode and not self.backend.startswith("vllm"):
            raise ValueError(f"engine.sleep_mode needs a vLLM backend (vllm, vllm-async), not {self.backend!r}")


def make_engine(config: EngineConfig | None = None, **overrides: Any) -> BaseEngine:
    """Build the engine `config` describes (keyword overrides win over config fields)."""
    config = attrs.evolve(config or EngineConfig(), **overrides)
    if config.backend == "scripted":
        from arl.engine.scripted import ScriptedEngine

        return ScriptedEngine.from_config(config)

    from arl.models import resolve_model

    path = resolve_model(config.model)
    if config.backend == "vllm":
        from arl.engine.vllm import VLLMEngine

        return VLLMEngine(
            path, max_model_len=config.max_model_len, seed=config.seed, dtype=config.dtype,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes, max_num_seqs=config.max_num_seqs,
            gpu_memory_utilization=config.gpu_memory_utilization, sleep_mode=config.sleep_mode, **config.extra,
        )
    if config.backend == "vllm-async":
        from arl.engine.vllm_async import AsyncVLLMEngine

        return AsyncVLLMEngine(
            path, max_model_len=config.max_model_len, seed=config.seed, dtype=config.dtype,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes, max_num_seqs=config.max_num_seqs,
            gpu_memory_utilization=config.gpu_memory_utilization, sleep_mode=config.sleep_mode, **config.extra,
        )
    from arl.engine.hf import HFEngine

    return HFEngine(
        path, max_model_len=config.max_model_len, seed=config.seed, dtype=config.dtype,
        max_batch_size=config.max_batch_size,
    )


__all__ = [
    "BACKENDS", "BaseEngine", "Engine", "EngineClosedError", "EngineConfig", "EngineError", "EngineUnsupportedError",
    "Generation", "InvalidPromptError", "LoRAAdapter", "PromptTooLongError", "SamplingParams", "make_engine",
]
