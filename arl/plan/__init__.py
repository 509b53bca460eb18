"""The memory planner (`arl plan`): what training a model with arl needs on one GPU, and which settings fit.

`planner` sums the terms and searches the settings; `terms` holds each memory term with its
equation and a worked example; `shapes` the model shapes the terms read (known models, a local
Hugging Face directory, or a zoo name). This package is the one import point: ``from arl.plan
import plan_memory, model_shape, TrainSetting``.
"""

from __future__ import annotations

from arl.plan.planner import EngineSetting, MemoryPlan, TrainSetting, plan_memory, standard_settings
from arl.plan.shapes import KNOWN_SHAPES, ModelShape, model_shape, shape_from_config
from arl.plan.terms import (
    ALL_LINEAR,
    BYTES,
    GiB,
    activation_bytes,
    head_activation_bytes,
    kv_cache_bytes,
    layer_activation_bytes,
    lora_parameter_count,
    parameter_count,
    projection_shapes,
)

__all__ = [
    "ALL_LINEAR",
    "BYTES",
    "KNOWN_SHAPES",
    "EngineSetting",
    "GiB",
    "MemoryPlan",
    "ModelShape",
    "TrainSetting",
    "activation_bytes",
    "head_activation_bytes",
    "kv_cache_bytes",
    "layer_activation_bytes",
    "lora_parameter_count",
    "model_shape",
    "parameter_count",
    "plan_memory",
    "projection_shapes",
    "shape_from_config",
    "standard_settings",
]
