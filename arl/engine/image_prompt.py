"""The records of an image prompt (`arl.engine.images` renders them): plain data, no engine, no processor.

`ImagePrompt` is what a caller gives `Engine.generate` (token ids + the images they refer to);
`RenderedPrompt` is what the engine runs and the trainer scores (expanded ids + pixel values).
A module of their own so the engine contract (`arl.engine.base`) can name them without importing
the renderer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import numpy as np


def _tuple_of_ints(ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(i) for i in ids)


@attrs.frozen(eq=False)
class ImagePrompt:
    """Token ids with one image placeholder token per image, and the images in order.

    ``images`` may hold PIL images, ``uint8`` arrays (``H x W x 3`` or ``H x W``, e.g. a game's
    ``frame()``), encoded image bytes (PNG, JPEG) or ``data:image/...;base64,`` URLs.
    """

    token_ids: tuple[int, ...] = attrs.field(converter=_tuple_of_ints)
    images: tuple[Any, ...] = attrs.field(converter=tuple)


@attrs.frozen(eq=False)
class RenderedPrompt:
    """An `ImagePrompt` as the model sees it: what the engine runs and the trainer scores.

    ``input_ids``: the expanded ids; ``pixel_values``: ``float32[patches, C*T*P*P]``, every image's
    patches in order; ``image_grid_thw``: ``int64[images, 3]``; ``images``: the RGB PIL images they
    came from; ``prompt``: the `ImagePrompt` rendered.
    """

    prompt: ImagePrompt
    input_ids: tuple[int, ...]
    pixel_values: np.ndarray
    image_grid_thw: np.ndarray
    images: tuple[Any, ...]
    image_token_id: int

    @property
    def image_token_mask(self) -> np.ndarray:
        """``bool[len(input_ids)]``: where the image tokens are (never a loss target)."""
        return np.asarray(self.input_ids) == self.image_token_id

    def model_inputs(self, device: Any = "cpu") -> dict[str, Any]:
        """The keyword arguments of a transformers Qwen2-VL forward for this prompt alone (batch 1):
        ``input_ids``, ``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids`` (1 on image tokens,
        from which the model computes its 3-D rotary positions)."""
        import torch

        return {
            "input_ids": torch.tensor([self.input_ids], dtype=torch.long, device=device),
            "pixel_values": torch.from_numpy(self.pixel_values).to(device),
            "image_grid_thw": torch.from_numpy(self.image_grid_thw).to(device),
            "mm_token_type_ids": torch.from_numpy(self.image_token_mask.astype(np.int64))[None].to(device),
        }


class Renderer(Protocol):
    """What an engine's ``image_renderer`` does (`arl.engine.images.ImageRenderer`, the scripted
    engine's fake-pixel one)."""

    image_token_id: int

    def render(self, prompt: ImagePrompt) -> RenderedPrompt: ...


__all__ = ["ImagePrompt", "RenderedPrompt", "Renderer"]
