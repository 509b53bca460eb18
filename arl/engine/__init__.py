"""Engines: one contract (`arl.engine.base`), four backends, one factory (`make_engine`, from an
`arl.config.EngineConfig`).

Backends are imported lazily so that `import arl.engine` does not import torch or vLLM.
"""

from __future__ import annotations

from typing import Any

import attrs

from arl._renamed import old_names
from arl.config import EngineConfig as _EngineConfig
from arl.engine.base import (
    BaseEngine,
    Engine,
    EngineClosedError,
    EngineError,
    EngineUnsupportedError,
    Generation,
    InvalidConstraintError,
    InvalidPromptError,
    LoRAAdapter,
    NoVisionTowerError,
    OutputConstraint,
    PromptTooLongError,
    SampledWith,
    SamplingParams,
    TooManyImagesError,
    UnreadableImageError,
)
from arl.engine.image_prompt import ImagePrompt, RenderedPrompt


def make_engine(config: _EngineConfig | None = None, **overrides: Any) -> BaseEngine:
    """Build the engine `config` (an `arl.config.EngineConfig`) describes (keyword overrides win over
    config fields)."""
    config = attrs.evolve(config or _EngineConfig(), **overrides)
    if config.dtype == "policy":  # a training config's "same as optim.precision": the trainer resolves it
        raise ValueError("engine dtype 'policy' means 'as optim.precision' and is resolved by the Trainer "
                         "(arl.train.precision.resolve_precision); an engine built on its own needs a dtype "
                         "(float32, bfloat16, float16 or auto)")
    if config.backend == "scripted":
        from arl.engine.scripted import ScriptedEngine

        return ScriptedEngine.from_config(config)

    from arl.models import resolve_model

    path = resolve_model(config.model)
    if config.backend in ("vllm", "vllm-async"):
        from arl.engine.vllm import VLLMEngine
        from arl.engine.vllm_async import AsyncVLLMEngine

        backend = VLLMEngine if config.backend == "vllm" else AsyncVLLMEngine
        return backend(
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
    "BaseEngine", "Engine", "EngineClosedError", "EngineError", "EngineUnsupportedError",
    "Generation", "ImagePrompt", "InvalidConstraintError", "InvalidPromptError", "LoRAAdapter", "NoVisionTowerError",
    "OutputConstraint", "PromptTooLongError", "RenderedPrompt", "SampledWith", "SamplingParams", "TooManyImagesError",
    "UnreadableImageError", "make_engine",
]

# EngineConfig and BACKENDS moved to arl.config with every config record: importable from here,
# deprecated (docs/architecture.md §10)
__getattr__ = old_names(__name__, globals(), BACKENDS="arl.config:BACKENDS", EngineConfig="arl.config:EngineConfig")
