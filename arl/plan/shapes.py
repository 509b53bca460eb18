"""Model shapes for the memory planner (`arl.plan`): the numbers of a decoder-only model that
decide its memory, for the zoo and the Qwen2.5 sizes (offline, each row citing its hub
config.json), or read from a local directory's config.json.

A vision-language model (Qwen2.5-VL, the zoo's tiny-vl) is its text decoder's shape plus
``vision_params``, the vision tower's parameter count (`vision_tower_params`): weights, gradients
and optimizer state count them; the activation terms are the decoder's (the tower runs once per
image, on a few hundred patches: small beside the decoder at the planner's sequence lengths).
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
    vision_params: int = 0  # a VLM's vision tower (`vision_tower_params`); 0 for a text model


def vision_tower_params(depth: int, embed: int, out_hidden: int, *, intermediate: int, gated: bool,
                        patch: int = 14, temporal_patch: int = 2, merge: int = 2, channels: int = 3) -> int:
    """Parameters of a Qwen2-VL (``gated=False``: LayerNorms, fc1/fc2 MLP) or Qwen2.5-VL (``gated=True``:
    RMSNorms, gate/up/down MLP) vision tower, from its config.json's vision_config.

        P = C*T*p*p*E                                   (patch embedding, a bias-free Conv3d)
          + depth * (norms + E*3E + 3E + E*E + E + mlp)  (blocks: fused qkv and proj with biases)
          + norm_q + (m*m*E)^2 + m*m*E + m*m*E*H + H    (merger: norm, 2-layer MLP onto the decoder's H)

    with norms 2*2E (LayerNorm: weight, bias) or 2E (RMSNorm), mlp 2*E*I + I + E (fc1, fc2) or
    3*E*I + 2I + E (gate, up, down), norm_q 2E or E. Qwen2.5-VL-3B (depth 32, E 1280, I 3420, H 2048):
    668,684,288, the model card's 3.75B less Qwen2.5-3B's 3.09B.

    >>> vision_tower_params(32, 1280, 2048, intermediate=3420, gated=True)
    668684288
    """
    e, i, mm = embed, intermediate, merge * merge * embed
    norms, norm_q = (2 * e, e) if gated else (4 * e, 2 * e)
    mlp = (3 * e * i + 2 * i + e) if gated else (2 * e * i + i + e)
    block = norms + e * 3 * e + 3 * e + e * e + e + mlp
    return channels * temporal_patch * patch * patch * e + depth * block + norm_q + mm * mm + mm + mm * out_hidden + out_hidden


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


def _tiny_vl_shape() -> ModelShape:
    from arl.models.tiny_vl import TinyVLSpec  # attrs-only import: no torch

    spec = TinyVLSpec()
    t = spec.text
    return ModelShape(
        "tiny-vl", vocab_size=701, hidden_size=t.hidden_size, num_layers=t.num_layers, num_heads=t.num_heads,
        num_kv_heads=t.num_kv_heads, head_dim=t.hidden_size // t.num_heads, intermediate_size=t.intermediate_size,
        tie_word_embeddings=True, attention_bias=True,
        source="arl.models.tiny_vl.TinyVLSpec(); vocab 701 = tiny's 697 + the 4 vision tokens",
        vision_params=vision_tower_params(spec.vision_depth, spec.vision_embed_dim, t.hidden_size,
                                          intermediate=spec.vision_embed_dim * spec.vision_mlp_ratio, gated=False),
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
        _tiny_vl_shape(),
        # Qwen2.5-VL: the Qwen2.5 decoder of the same size (vocab 151936 / 152064 as there) and a 32-block
        # vision tower (hidden 1280, intermediate 3420, out_hidden = the decoder's hidden size)
        ModelShape("qwen2.5-vl-3b", 151936, 2048, 36, 16, 2, 128, 11008, True, True,
                   _HF.format("Qwen/Qwen2.5-VL-3B-Instruct"),
                   vision_tower_params(32, 1280, 2048, intermediate=3420, gated=True)),
        ModelShape("qwen2.5-vl-7b", 152064, 3584, 28, 28, 4, 128, 18944, False, True,
                   _HF.format("Qwen/Qwen2.5-VL-7B-Instruct"),
                   vision_tower_params(32, 1280, 3584, intermediate=3420, gated=True)),
    ]
}
_ALIASES = {
    "smollm2-135m-instruct": "smollm2-135m",
    "huggingfacetb/smollm2-135m-instruct": "smollm2-135m",
    **{f"qwen/qwen2.5-{s}-instruct": f"qwen2.5-{s}" for s in ("0.5b", "1.5b", "3b", "7b")},
    **{f"qwen2.5-{s}-instruct": f"qwen2.5-{s}" for s in ("0.5b", "1.5b", "3b", "7b")},
    **{f"qwen/qwen2.5-vl-{s}-instruct": f"qwen2.5-vl-{s}" for s in ("3b", "7b")},
    **{f"qwen2.5-vl-{s}-instruct": f"qwen2.5-vl-{s}" for s in ("3b", "7b")},
}


def _vision_params(vision: Any) -> int:
    """`vision_tower_params` of a Qwen2-VL (``embed_dim``, ``mlp_ratio``) or Qwen2.5-VL
    (``hidden_size``, ``intermediate_size``, ``out_hidden_size``) vision_config."""
    get = lambda key, default=None: getattr(vision, key, default)  # noqa: E731
    if get("out_hidden_size") is not None:  # Qwen2.5-VL
        return vision_tower_params(get("depth"), get("hidden_size"), get("out_hidden_size"),
                                   intermediate=get("intermediate_size"), gated=True, patch=get("patch_size", 14),
                                   temporal_patch=get("temporal_patch_size", 2), merge=get("spatial_merge_size", 2))
    embed = get("embed_dim")
    return vision_tower_params(get("depth"), embed, get("hidden_size"), intermediate=int(embed * get("mlp_ratio")),
                               gated=False, patch=get("patch_size", 14), temporal_patch=get("temporal_patch_size", 2),
                               merge=get("spatial_merge_size", 2))


def shape_from_config(config: Any, name: str = "") -> ModelShape:
    """The shape of a transformers config (a `PretrainedConfig`, e.g. from `AutoConfig`); a VLM's is its
    text decoder's (``get_text_config()``) plus its vision tower's parameters."""
    vision = getattr(config, "vision_config", None)
    tied = getattr(config, "tie_word_embeddings", None)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    get = lambda key, default=None: getattr(config, key, default)  # noqa: E731
    heads = get("num_attention_heads")
    return ModelShape(
        name or get("_name_or_path", "") or get("model_type", "model"),
        vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), num_layers=get("num_hidden_layers"),
        num_heads=heads, num_kv_heads=get("num_key_value_heads") or heads,
        head_dim=get("head_dim") or get("hidden_size") // heads, intermediate_size=get("intermediate_size"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False) if tied is None else tied),
        # Qwen2's config has no flag: its q/k/v carry biases by construction (so do Qwen2-VL's and Qwen2.5-VL's)
        attention_bias=bool(get("attention_bias", get("model_type") in ("qwen2", "qwen2_vl_text", "qwen2_5_vl_text"))),
        source=f"config of {name}" if name else "transformers config",
        vision_params=_vision_params(vision) if vision is not None else 0,
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


__all__ = ["KNOWN_SHAPES", "ModelShape", "model_shape", "shape_from_config", "vision_tower_params"]
