"""Shared fixtures: the tiny model, its tokenizer, and one session-scoped real engine per vLLM backend;
tiny-vl, its tokenizer, and its HF and vLLM engines (one per test module; helpers in tests/vision_support.py).

Engines are loop-agnostic (each `generate()` resolves a future on the caller's running loop), so
one engine serves every test's event loop. Async tests use anyio's pytest plugin on asyncio.
"""

from __future__ import annotations

import logging
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from arl.models import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


def _close(engine) -> None:
    import asyncio

    asyncio.run(engine.close())


@pytest.fixture(scope="session")
def vllm_engine(tiny_path):
    """One in-process vLLM engine on the tiny model for the whole session."""
    from arl.engine import make_engine

    engine = make_engine(backend="vllm", model="tiny", max_model_len=2048, kv_cache_memory_bytes=128 * 2**20)
    yield engine
    _close(engine)


@pytest.fixture(scope="session")
def vllm_async_engine(tiny_path):
    """One AsyncLLM engine (engine core in a vLLM child process) for the whole session."""
    from arl.engine import make_engine

    engine = make_engine(
        backend="vllm-async", model="tiny", max_model_len=2048, kv_cache_memory_bytes=128 * 2**20
    )
    yield engine
    _close(engine)


@pytest.fixture(scope="session")
def hf_engine(tiny_path):
    from arl.engine import make_engine

    engine = make_engine(backend="hf", model="tiny", max_model_len=2048)
    yield engine
    _close(engine)


@pytest.fixture(scope="session")
def vl_path() -> str:
    """The zoo's tiny-vl (a Qwen2-VL model, random init), built once."""
    from arl.models import resolve_model

    return resolve_model("tiny-vl")


@pytest.fixture(scope="session")
def vl_tokenizer(vl_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vl_path)


@pytest.fixture(scope="module")
def hf_vl(vl_path):
    """An HF engine on tiny-vl, fresh for each test module (a module may train its weights)."""
    from arl.engine.hf import HFEngine

    engine = HFEngine(vl_path, max_model_len=1024)
    yield engine
    _close(engine)


@pytest.fixture(scope="module")
def vllm_vl(vl_path):
    """An in-process vLLM engine on tiny-vl for one test module (tests that use it carry the `vllm` marker)."""
    from arl.engine.vllm import VLLMEngine

    engine = VLLMEngine(vl_path, max_model_len=1024, kv_cache_memory_bytes=64 * 2**20)
    yield engine
    _close(engine)


@pytest.fixture
def scripted_engine(tiny_path):
    """A fresh scripted engine (random valid answers, deterministic per prompt) on the tiny tokenizer."""
    from arl.engine import make_engine

    engine = make_engine(backend="scripted", model="tiny")
    yield engine
    _close(engine)


@pytest.fixture(autouse=True)
def _drop_cli_log_handlers():
    """Tests that call `arl.cli.main` in process get the CLI's console handler on the root logger,
    bound to that test's captured stderr; pytest closes that stream after the test, and any later
    warning would then print a "Logging error" into another test's output. Remove them after each
    test, as a fresh process would not have them."""
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_arl_cli", False)]:
        root.removeHandler(handler)
        handler.close()
    logging.captureWarnings(False)

