"""``tiny-vl``: a random-init Qwen2-VL model small enough for 2 CPU cores, and the processor that reads its images.

What is built (`build_tiny_vl`, cached by the zoo under ``$ARL_HOME/models/tiny-vl-<hash>``):

- the tiny model's game tokenizer (`arl.models.zoo.build_game_tokenizer`) plus Qwen2-VL's four
  vision tokens (`VISION_TOKENS`) as special tokens, and a ChatML template that renders a
  message's content parts: ``{"type": "image"}`` (or ``"image_url"``) becomes `IMAGE_PLACEHOLDER`,
  ``<|vision_start|><|image_pad|><|vision_end|>``, whose one ``<|image_pad|>`` the processor
  expands to the image's token count;
- transformers' ``Qwen2VLForConditionalGeneration`` (what vLLM serves as well): the tiny model's
  text stack (hidden 128, 2 layers, head_dim 32, M-RoPE sections 2/7/7 = head_dim / 2, rope theta 2: `TinyVLSpec` says why) and a
  2-block vision tower (embed 64, 2 heads, patch 14, 2x2 merge: one token per 28 x 28 px, the cell
  size of `arl.envs.render`);
- the image processor's config (``preprocessor_config.json``): Qwen2-VL's, with
  ``min_pixels = 28*28`` and ``max_pixels = 28*28*256`` (at most 256 tokens an image).

`load_processor` reads the processor of any Qwen2-VL-family directory. transformers' Qwen2-VL
processor insists on a video processor, which needs torchvision, and the CPU install ships none
(scripts/stub_wheels.py); arl shows models images, never videos, so where torchvision is missing
the processor is built image-only (`image_only_processor_class`) around transformers' PIL image
processor: the same resize, normalisation and patching, the same pixel values.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from arl.models.zoo import CHATML_TEMPLATE, TinySpec, build_game_tokenizer

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_PAD = "<|image_pad|>"
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"

_CONTENT = (
    "{% if CONTENT is string %}{{ CONTENT }}{% else %}{% for part in CONTENT %}"
    "{% if part.type == 'image' or part.type == 'image_url' %}" + IMAGE_PLACEHOLDER +
    "{% elif part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}"
)
# CHATML_TEMPLATE with every plain content (system and user/tool-less turns) rendered part by part.
VL_CHATML_TEMPLATE = (
    CHATML_TEMPLATE
    .replace("<|im_start|>system\n{{ messages[0].content }}<|im_end|>",
             "<|im_start|>system\n" + _CONTENT.replace("CONTENT", "messages[0].content") + "<|im_end|>")
    .replace("<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>",
             "<|im_start|>{{ message.role }}\n" + _CONTENT.replace("CONTENT", "message.content") + "<|im_end|>")
)
assert VL_CHATML_TEMPLATE.count("{% for part in") == 2, "CHATML_TEMPLATE changed: update VL_CHATML_TEMPLATE"


@attrs.frozen
class TinyVLSpec:
    """Everything that determines tiny-vl; its hash names the cache directory."""

    text: TinySpec = TinySpec()
    vision_depth: int = 2
    vision_embed_dim: int = 64
    vision_heads: int = 2  # head_dim 32, as the text stack's
    vision_mlp_ratio: int = 2
    # M-RoPE gives the temporal, height and width sections consecutive frequencies of head_dim/2 = 16
    # (theta^(-i/16) rad per position), the width the slowest. At Qwen2-VL's (4, 6, 6) and theta 1e6,
    # neighbouring columns differ by < 2e-4 rad and rows by < 0.04: the text stack can hardly tell
    # where a cell is. Supervised on BFS-optimal FrozenLake moves from frames (benchmarks/ceiling.py,
    # "Supervised ceiling"), that model needs 6 epochs to reach 0.89 held-out accuracy; with (2, 7, 7)
    # and theta 2 (every section turns 0.52-1 rad per position) it reaches 0.88 in 2.
    mrope_section: tuple[int, int, int] = (2, 7, 7)
    rope_theta: float = 2.0
    min_pixels: int = 28 * 28
    max_pixels: int = 28 * 28 * 256

    def key(self) -> str:
        blob = self.text.key() + "|vl1|" + json.dumps(attrs.asdict(self, filter=lambda a, _: a.name != "text"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_tiny_vl(dest: Path, spec: TinyVLSpec = TinyVLSpec()) -> None:
    """Write tokenizer, image processor and random-init Qwen2-VL model for `spec` into `dest`."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    t = spec.text
    tok = build_game_tokenizer(t)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tok.chat_template = VL_CHATML_TEMPLATE
    ids = {name: tok.convert_tokens_to_ids(name) for name in VISION_TOKENS}
    head_dim = t.hidden_size // t.num_heads
    if 2 * sum(spec.mrope_section) != head_dim:
        raise ValueError(f"mrope_section {spec.mrope_section} must add up to head_dim / 2 = {head_dim // 2}")
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
            num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads, num_key_value_heads=t.num_kv_heads,
            max_position_embeddings=t.max_position_embeddings, tie_word_embeddings=True,
            rope_scaling={"type": "mrope", "mrope_section": list(spec.mrope_section)}, rope_theta=spec.rope_theta,
            initializer_range=t.init_std, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            bos_token_id=None,
        ),
        vision_config=dict(
            depth=spec.vision_depth, embed_dim=spec.vision_embed_dim, hidden_size=t.hidden_size,
            num_heads=spec.vision_heads, mlp_ratio=spec.vision_mlp_ratio, patch_size=14, spatial_merge_size=2,
            temporal_patch_size=2, in_channels=3,
        ),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(t.seed)
    model = Qwen2VLForConditionalGeneration(config).float()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    Qwen2VLImageProcessorPil(min_pixels=spec.min_pixels, max_pixels=spec.max_pixels).save_pretrained(dest)


def has_vision_tower(config: Any) -> bool:
    """Does a transformers config (or a config.json dict) describe a model with a vision tower?"""
    if isinstance(config, dict):
        return isinstance(config.get("vision_config"), dict)
    return getattr(config, "vision_config", None) is not None


# What a logit of a token no VLM may sample is set to (`mask_logits`): exp(-1e4) is 0 in fp32, bf16 and
# fp16, so the token has probability 0 exactly, while p * log p stays 0 (entropy), not NaN as with -inf.
MASKED_LOGIT = -1e4


def vision_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The ids of `VISION_TOKENS` that ``tokenizer`` knows: the tokens a VLM reads but must never sample.

    A sampled ``<|image_pad|>`` is an image slot with no image (the trainer's forward fails: "image
    features and image tokens do not match"), and a sampled ``<|vision_start|>`` opens one; so every
    engine serving a VLM forbids all four (vLLM: ``bad_words``; HF: `mask_logits`; scripted: refuses
    a script with them) and the trainer scores with the same mask, so engine and trainer log-probs
    describe one distribution. A tokenizer without them (a text model) gives ().
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    ids = []
    for token in VISION_TOKENS:
        i = tokenizer.convert_tokens_to_ids(token)
        if isinstance(i, int) and i != unk and i >= 0:
            ids.append(i)
    return tuple(ids)


def mask_logits(model: Any, token_ids: tuple[int, ...] | list[int]) -> Any:
    """Make ``model`` never give ``token_ids`` any probability: its output embedding's (the LM head's)
    logits for them become `MASKED_LOGIT`, in every forward (training, scoring, generation, a deep
    copy: a forward hook). Installing it again replaces the earlier mask. Returns ``model``.

    >>> import torch
    >>> class Toy(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.head = torch.nn.Linear(2, 4, bias=False)
    ...     def get_output_embeddings(self):
    ...         return self.head
    ...     def forward(self, x):
    ...         return self.head(x)
    >>> toy = mask_logits(Toy(), [1, 3])
    >>> torch.softmax(toy(torch.ones(1, 2)), -1)[0, [1, 3]].tolist()
    [0.0, 0.0]
    """
    import torch

    head = model.get_output_embeddings()
    head._forward_hooks.pop(getattr(head, "_arl_mask_hook", None), None)  # by key: a deep copy has its own
    index = torch.tensor(sorted({int(t) for t in token_ids}), dtype=torch.long)

    def hook(module: Any, args: Any, output: Any) -> Any:
        if index.numel() == 0:
            return output
        return output.index_fill(-1, index.to(output.device), MASKED_LOGIT)

    head._arl_mask_hook = head.register_forward_hook(hook).id
    return model


def auto_model_class(model_path: str | Path) -> Any:
    """The transformers auto class that loads the model at ``model_path``: ``AutoModelForImageTextToText``
    for a model with a vision tower (a Qwen2-VL-family VLM), else ``AutoModelForCausalLM``. The
    trainer's policy and the HF engine load the same class, so their parameter names agree."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if has_vision_tower(AutoConfig.from_pretrained(model_path)) else AutoModelForCausalLM


def _processor_classes() -> dict[str, type]:
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor

    return {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor}


@functools.cache
def image_only_processor_class(model_type: str) -> type:
    """transformers' processor class of ``model_type`` (``qwen2_vl``, ``qwen2_5_vl``) as a subclass that
    accepts no video processor (``ImageOnlyQwen2VLProcessor``): isinstance checks against the base
    class, vLLM's among them, still pass."""
    classes = _processor_classes()
    if model_type not in classes:
        raise ValueError(f"no image processor for model_type {model_type!r} (arl knows {sorted(classes)})")
    base = classes[model_type]

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor" and argument is None:
            return None  # images only: no video processor, so no torchvision
        return base.check_argument_for_proper_class(self, argument_name, argument)

    return type(f"ImageOnly{base.__name__}", (base,),
                {"check_argument_for_proper_class": check_argument_for_proper_class, "__module__": __name__})


_PROCESSORS: dict[str, Any] = {}


def load_processor(path: str | Path, tokenizer: Any = None) -> Any:
    """The processor (image processor + tokenizer + chat template) of a Qwen2-VL-family directory.

    transformers' own (``AutoProcessor``) where torchvision is installed; else the image-only one
    over transformers' PIL image processor (module docstring). Cached per directory: every caller
    in a process (the engine's renderer, in-process vLLM, the trainer) gets the same object, built
    with the first caller's ``tokenizer`` (default: the directory's).
    """
    key = str(Path(path).resolve())
    if key in _PROCESSORS:
        return _PROCESSORS[key]
    config = json.loads((Path(path) / "config.json").read_text())
    if not has_vision_tower(config):
        raise ValueError(f"{path} has no vision tower (its config.json has no vision_config)")
    try:
        import torchvision  # noqa: F401
    except ImportError:
        from transformers import AutoTokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
        cls = image_only_processor_class(config.get("model_type", "qwen2_vl"))
        processor = cls(image_processor=Qwen2VLImageProcessorPil.from_pretrained(path), tokenizer=tok,
                        video_processor=None, chat_template=getattr(tok, "chat_template", None))
    else:
        from transformers import AutoProcessor

        kwargs = {"tokenizer": tokenizer} if tokenizer is not None else {}
        processor = AutoProcessor.from_pretrained(path, **kwargs)
    _PROCESSORS[key] = processor
    return processor


__all__ = [
    "IMAGE_PAD", "IMAGE_PLACEHOLDER", "MASKED_LOGIT", "VISION_TOKENS", "VL_CHATML_TEMPLATE", "TinyVLSpec",
    "auto_model_class", "build_tiny_vl", "has_vision_tower", "image_only_processor_class", "load_processor",
    "mask_logits", "vision_token_ids",
]
