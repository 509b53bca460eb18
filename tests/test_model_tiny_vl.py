"""The zoo's tiny-vl (issue 46 item 2): a Qwen2-VL model built locally beside its processor, with
the tiny model's game tokenizer plus the image tokens and a chat template that renders images."""

from __future__ import annotations

import json
from pathlib import Path

from arl.models import ZOO, resolve_model
from arl.models.tiny_vl import IMAGE_PLACEHOLDER, VISION_TOKENS, TinyVLSpec, load_processor


def test_tiny_vl_is_in_the_zoo_and_cached_by_its_spec(vl_path):
    assert "tiny-vl" in ZOO
    assert Path(vl_path).name == f"tiny-vl-{TinyVLSpec().key()}"
    assert resolve_model("tiny-vl") == vl_path  # built once
    names = {p.name for p in Path(vl_path).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"} <= names


def test_config_is_qwen2_vl_with_a_vision_tower(vl_path):
    config = json.loads((Path(vl_path) / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]
    vision = config["vision_config"]
    assert (vision["patch_size"], vision["spatial_merge_size"]) == (14, 2)  # one token per 28 px: arl.envs.render
    assert config["text_config"]["rope_parameters"]["mrope_section"] == list(TinyVLSpec().mrope_section)


def test_tokenizer_is_the_game_tokenizer_plus_image_tokens(vl_path, tiny_tokenizer):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(vl_path)
    assert len(tok) == len(tiny_tokenizer) + len(VISION_TOKENS)
    text = "Observation:\n#_OP\n<answer>Up</answer>"
    assert tok.encode(text, add_special_tokens=False) == tiny_tokenizer.encode(text, add_special_tokens=False)
    for name in VISION_TOKENS:
        assert len(tok.encode(name, add_special_tokens=False)) == 1


def test_chat_template_renders_image_parts(vl_path):
    processor = load_processor(vl_path)
    messages = [{"role": "system", "content": "rules"},
                {"role": "user", "content": [{"type": "text", "text": "See "}, {"type": "image"}, {"type": "text", "text": "."}]}]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nrules<|im_end|>\n<|im_start|>user\nSee " + IMAGE_PLACEHOLDER
                    + ".<|im_end|>\n<|im_start|>assistant\n")
    assert load_processor(vl_path) is processor  # one processor object per directory
