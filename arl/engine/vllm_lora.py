"""LoRA serving shared by both vLLM backends: engine arguments, and the directories pushed adapters live in.

vLLM serves an adapter per request (`LoRARequest(name, id, path)`) and loads it from a peft
directory (adapter_config.json + adapter_model.safetensors); there is no in-memory path. So a push
writes the adapter (megabytes) into a directory of its own under one temp root per engine, and the
directory stays until vLLM has unloaded that adapter: vLLM reloads an adapter from its path if it
evicted it from its CPU cache while requests still use it.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs

from arl.engine.base import LoRAAdapter


def lora_engine_args(rank: int, max_loras: int = 2) -> dict[str, Any]:
    """EngineArgs that let an engine serve LoRA adapters of rank <= `rank`. vLLM accepts only some
    `max_lora_rank` values (1, 8, 16, 32, ...): the smallest that fits is taken. Two adapter slots: the
    current policy's and the one its predecessor's still-running requests finish on."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    fits = [r for r in sorted(get_args(MaxLoRARanks)) if r >= rank]
    if not fits:
        raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {max(get_args(MaxLoRARanks))}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": max_loras}


@attrs.define(eq=False)
class ServedAdapter:
    """One pushed adapter as vLLM serves it: a `LoRARequest` on a directory of its own."""

    version: int  # the policy version it is
    request: Any  # vllm LoRARequest
    path: Path
    in_flight: int = 0  # requests running on it (touched only by the thread that adds requests)


class AdapterStore:
    """The directories pushed adapters live in while vLLM may (re)load them (vLLM loads an adapter
    from a peft directory, and reloads it from there if it evicted it from its cache meanwhile)."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._ids = itertools.count(1)  # LoRA ids must be > 0 and never reused for other weights

    def write(self, adapter: LoRAAdapter, version: int) -> ServedAdapter:
        from vllm.lora.request import LoRARequest

        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="arl-lora-"))
        lora_id = next(self._ids)
        name = f"arl-policy-v{version}-{lora_id}"
        path = adapter.save(self._root / name)
        return ServedAdapter(version, LoRARequest(name, lora_id, str(path)), path)

    def discard(self, served: ServedAdapter) -> None:
        shutil.rmtree(served.path, ignore_errors=True)

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)


def lora_enabled(engine: Any) -> bool:
    """Whether a vLLM engine (LLMEngine or AsyncLLM) was started with LoRA support."""
    return getattr(getattr(engine, "vllm_config", None), "lora_config", None) is not None
