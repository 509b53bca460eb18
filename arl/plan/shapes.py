"""Model shapes for the memory planner (`arl.plan`): the numbers of a decoder-only model that
decide its memory, for the zoo and the Qwen2.5 sizes (offline, each row citing its hub
config.json), or read from a local directory's config.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs


@attrs.frozen
class ModelShape:
    """The numbers of a decoder-only (Llama / Qwen2 style) model that decide its memory."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    attention_bias: bool  # Qwen2: biases on q, k, v; Llama / SmolLM2: none
    source: str = ""


def _tiny_shape() -> ModelShape:
    from arl.models import TinySpec  # attrs-only import: no torch

    spec = TinySpec()
    return ModelShape(
        "tiny", vocab_size=697, hidden_size=spec.hidden_size, num_layers=spec.num_layers,
        num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.hidden_size // spec.num_heads,
        intermediate_size=spec.intermediate_size, tie_word_embeddings=True, attention_bias=True,
        # the vocab is what BPE learns from the game corpus, not TinySpec.vocab_size (a cap)
        source="arl.models.TinySpec(); vocab 697 = the built tokenizer (config.json of `arl models build tiny`)",
    )


_HF = "config.json of huggingface.co/{}"
# name -> shape. The Qwen2.5 and SmolLM2 numbers are copied from the config.json of each hub
# repository (cited per row); tests/test_plan.py checks each against the parameter count on its
# model card, and the zoo models against `sum(p.numel())` of the built model.
KNOWN_SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in [
        _tiny_shape(),
        ModelShape("smollm2-135m", 49152, 576, 30, 9, 3, 64, 1536, True, False,
                   _HF.format("HuggingFaceTB/SmolLM2-135M-Instruct")),
        ModelShape("qwen2.5-0.5b", 151936, 896, 24, 14, 2, 64, 4864, True, True,
                   _HF.format("Qwen/Qwen2.5-0.5B-Instruct")),
        ModelShape("qwen2.5-1.5b", 151936, 1536, 28, 12, 2, 128, 8960, True, True,
                   _HF.format("Qwen/Qwen2.5-1.5B-Instruct")),
        ModelShape("qwen2.5-3b", 151936, 2048, 36, 16, 2, 128, 11008, True, True,
                   _HF.format("Qwen/Qwen2.5-3B-Instruct")),
        ModelShape("qwen2.5-7b", 152064, 3584, 28, 28, 4, 128, 18944, False, True,
                   _HF.format("Qwen/Qwen2.5-7B-Instruct")),
    ]
}
_ALIASES = {
    "smollm2-135m-instruct": "smollm2-135m",
    "huggingfacetb/smollm2-135m-instruct": "smollm2-135m",
    **{f"qwen/qwen2.5-{s}-instruct": f"qwen2.5-{s}" for s in ("0.5b", "1.5b", "3b", "7b")},
    **{f"qwen2.5-{s}-instruct": f"qwen2.5-{s}" for s in ("0.5b", "1.5b", "3b", "7b")},
}


def shape_from_config(config: Any, name: str = "") -> ModelShape:
    """The shape of a transformers config (a `PretrainedConfig`, e.g. from `AutoConfig`)."""
    get = lambda key, default=None: getattr(config, key, default)  # noqa: E731
    heads = get("num_attention_heads")
    return ModelShape(
        name or get("_name_or_path", "") or get("model_type", "model"),
        vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), num_layers=get("num_hidden_layers"),
        num_heads=heads, num_kv_heads=get("num_key_value_heads") or heads,
        head_dim=get("head_dim") or get("hidden_size") // heads, intermediate_size=get("intermediate_size"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        # Qwen2's config has no flag: its q/k/v carry biases by construction
        attention_bias=bool(get("attention_bias", get("model_type") == "qwen2")),
        source=f"config of {name}" if name else "transformers config",
    )


def model_shape(name: str) -> ModelShape:
    """A known shape by name or hub id (offline), else the config.json of a local directory."""
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key in KNOWN_SHAPES:
        return KNOWN_SHAPES[key]
    path = Path(name).expanduser()
    if path.is_dir():
        from transformers import AutoConfig

        return shape_from_config(AutoConfig.from_pretrained(path), name=str(name))
    from arl.models import UnknownModelError

    raise UnknownModelError(f"no known shape for {name!r} (known: {', '.join(KNOWN_SHAPES)}) "
                            "and not a local directory with a config.json")


__all__ = ["KNOWN_SHAPES", "ModelShape", "model_shape", "shape_from_config"]
