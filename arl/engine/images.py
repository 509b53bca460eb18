"""Image prompts: token ids plus the images they refer to, rendered once for engine and trainer alike.

The contract (docs/guide.md "Images"): an `ImagePrompt` is the token ids of a prompt in which each
image stands as ONE ``<|image_pad|>`` token (what the chat template writes for an image content
part, ``<|vision_start|><|image_pad|><|vision_end|>``), and its images in order. `ImageRenderer`
owns the model's processor (`arl.models.tiny_vl.load_processor`) and turns it into a
`RenderedPrompt`: the EXPANDED ids (each ``<|image_pad|>`` repeated once per image token,
``grid_t * grid_h * grid_w / merge**2``), the pixel values and the ``image_grid_thw`` rows.

Why one renderer: a VL sample must show the model the same image tokens where the engine samples
and where the trainer scores; every framework that expands placeholders on the two sides
separately has shipped "image features and image tokens do not match" crashes or silently
misaligned training. So the engine runs the expanded ids the renderer wrote (and reports them:
`Generation.prompt_token_ids`), the trainer's forward takes `RenderedPrompt.model_inputs()`, and
both come from one `render()` call over one processor object; in-process vLLM is handed that
same processor object (`arl.engine.vllm_vision`), so its pixel values are computed by the same
code from the same images.

Errors are typed, subclasses of `InvalidPromptError` (the request is refused, the engine serves on):
`UnreadableImageError` (not an image, or bytes PIL cannot decode), `NoVisionTowerError` (an image
for a text-only model), `TooManyImagesError` (the expanded prompt leaves no room in the context),
and a plain `InvalidPromptError` when the placeholders and the images do not pair up.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np

from arl.engine.base import InvalidPromptError, NoVisionTowerError, TooManyImagesError, UnreadableImageError
from arl.engine.image_prompt import ImagePrompt, RenderedPrompt


def to_pil(image: Any) -> Any:
    """An image in any form `ImagePrompt` takes, as an RGB PIL image; `UnreadableImageError` if not one.

    >>> to_pil(np.zeros((28, 56, 3), np.uint8)).size
    (56, 28)
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (3, 4)):
            raise UnreadableImageError(f"an image array must be uint8 H x W (x 3|4), got {image.dtype} {image.shape}")
        if min(image.shape[:2]) < 1:
            raise UnreadableImageError(f"an image array must not be empty, got shape {image.shape}")
        return Image.fromarray(image).convert("RGB")
    if isinstance(image, str) and image.startswith("data:image/"):
        head, _, payload = image.partition(",")
        if not head.endswith(";base64"):
            raise UnreadableImageError(f"a data URL image must be base64 ({head[:40]!r})")
        try:
            image = base64.b64decode(payload, validate=True)
        except ValueError as exc:
            raise UnreadableImageError(f"the data URL's base64 does not decode: {exc}") from exc
    if isinstance(image, bytes | bytearray | memoryview):
        try:
            with Image.open(io.BytesIO(bytes(image))) as img:
                return img.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise UnreadableImageError(f"{len(bytes(image))} bytes that PIL cannot decode as an image: {exc}") from exc
    raise UnreadableImageError(
        f"cannot read a {type(image).__name__} as an image (give a PIL image, a uint8 array, image bytes "
        "or a data:image/...;base64 URL)")


def to_data_url(image: Any) -> str:
    """An image in any form `to_pil` reads as a ``data:image/png;base64,`` URL (lossless: the pixels
    `to_pil` reads back are the same), for HTML views and OpenAI ``image_url`` content parts.

    >>> url = to_data_url(np.full((28, 28, 3), 200, np.uint8))
    >>> url[:22], np.asarray(to_pil(url))[0, 0].tolist()
    ('data:image/png;base64,', [200, 200, 200])
    """
    buf = io.BytesIO()
    to_pil(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class ImageRenderer:
    """Owns a Qwen2-VL-family model's processor; `render` turns `ImagePrompt` into `RenderedPrompt`.

    ``model_path``: the model directory (config.json with a ``vision_config``, the image
    processor's preprocessor_config.json, the tokenizer). `NoVisionTowerError` for a text-only one.
    """

    def __init__(self, model_path: str | Path, tokenizer: Any = None):
        import json

        from arl.models.tiny_vl import has_vision_tower, load_processor

        config = json.loads((Path(model_path) / "config.json").read_text())
        if not has_vision_tower(config):
            raise NoVisionTowerError(f"{model_path} has no vision tower: it cannot be shown images")
        self.model_path = str(model_path)
        self.processor = load_processor(model_path, tokenizer)
        self.image_processor = self.processor.image_processor
        self.image_token_id = int(config["image_token_id"])
        self.merge = int(getattr(self.image_processor, "merge_size", 2))

    def tokens_per_image(self, image: Any) -> int:
        """How many image tokens ``image`` expands to (after the processor's resize)."""
        return int(self._pixels([to_pil(image)])[1][0].prod()) // self.merge**2

    def _pixels(self, images: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        try:
            out = self.image_processor(images=images, return_tensors="np")
        except Exception as exc:  # noqa: BLE001 -- the processor raises ValueError/TypeError/its own
            raise UnreadableImageError(f"the image processor cannot read the image(s): {exc}") from exc
        return np.ascontiguousarray(out["pixel_values"], dtype=np.float32), np.asarray(out["image_grid_thw"], np.int64)

    def render(self, prompt: ImagePrompt) -> RenderedPrompt:
        """Expand each placeholder to its image's tokens and compute the pixel values (once)."""
        ids = prompt.token_ids
        slots = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(slots) != len(prompt.images):
            raise InvalidPromptError(
                f"the prompt has {len(slots)} image placeholder token(s) (id {self.image_token_id}) for "
                f"{len(prompt.images)} image(s): one placeholder per image, not yet expanded")
        if not prompt.images:
            raise InvalidPromptError("an image prompt needs at least one image (send plain token ids otherwise)")
        images = tuple(to_pil(img) for img in prompt.images)
        pixel_values, grid = self._pixels(list(images))
        counts = (grid.prod(axis=1) // self.merge**2).tolist()
        expanded: list[int] = []
        start = 0
        for slot, n in zip(slots, counts, strict=True):
            expanded.extend(ids[start:slot])
            expanded.extend([self.image_token_id] * int(n))
            start = slot + 1
        expanded.extend(ids[start:])
        return RenderedPrompt(prompt, tuple(expanded), pixel_values, grid, images, self.image_token_id)


def check_context(rendered: RenderedPrompt, max_model_len: int) -> None:
    """`TooManyImagesError` when the expanded prompt leaves no token of ``max_model_len`` to generate."""
    n = len(rendered.input_ids)
    if n >= max_model_len:
        text = len(rendered.prompt.token_ids) - len(rendered.images)
        raise TooManyImagesError(
            f"{len(rendered.images)} image(s) ({n - text} image tokens) and {text} text tokens make a prompt of "
            f"{n} tokens; the model's context of {max_model_len} leaves no room to generate: send fewer or "
            "smaller images")


def fake_pixels(prompt: ImagePrompt, image_token_id: int, tokens_per_image: int = 4) -> RenderedPrompt:
    """A `RenderedPrompt` without a processor, for engines with no model (the scripted engine): each
    image becomes ``tokens_per_image`` image tokens and its pixels a deterministic function of the
    image (it shrunk to ``2 x 2*tokens_per_image`` px, values / 255), so tests can tell images apart
    and check that they travel with their prompt.

    >>> r = fake_pixels(ImagePrompt([5, 9, 6], [np.zeros((4, 4, 3), np.uint8)]), image_token_id=9)
    >>> r.input_ids, r.pixel_values.shape, r.image_grid_thw.tolist()
    ((5, 9, 9, 9, 9, 6), (16, 3), [[1, 2, 8]])
    """
    images = tuple(to_pil(img) for img in prompt.images)
    slots = [i for i, t in enumerate(prompt.token_ids) if t == image_token_id]
    if len(slots) != len(images) or not images:
        raise InvalidPromptError(f"the prompt has {len(slots)} image placeholder token(s) for {len(images)} image(s)")
    expanded: list[int] = []
    start = 0
    for slot in slots:
        expanded.extend(prompt.token_ids[start:slot])
        expanded.extend([image_token_id] * tokens_per_image)
        start = slot + 1
    expanded.extend(prompt.token_ids[start:])
    rows = []
    for img in images:
        small = np.asarray(img.resize((2 * tokens_per_image, 2)), dtype=np.float32).reshape(-1, 3) / 255.0
        rows.append(small)
    grid = np.array([[1, 2, 2 * tokens_per_image]] * len(images), dtype=np.int64)
    return RenderedPrompt(prompt, tuple(expanded), np.concatenate(rows), grid, images, image_token_id)


__all__ = [
    "ImagePrompt", "ImageRenderer", "NoVisionTowerError", "RenderedPrompt", "TooManyImagesError",
    "UnreadableImageError", "check_context", "fake_pixels", "to_data_url", "to_pil",
]
