"""The engine contract every backend implements (DESIGN.md §4).

Token-in / token-out: `generate()` takes prompt token ids and returns the generated token ids
with one log-prob per token (after temperature, i.e. the distribution actually sampled from).
Errors are typed so the rollout boundary can turn them into data.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import attrs
import numpy as np

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

FinishReason = Literal["stop", "length", "abort"]


class EngineError(RuntimeError):
    """An engine failed to serve a request (the request is lost, the engine may still serve)."""


class InvalidPromptError(EngineError, ValueError):
    """The prompt cannot be served: empty, token ids out of vocabulary, or too long."""


class PromptTooLongError(InvalidPromptError):
    """prompt_len + 1 exceeds the model's context: not even one token can be generated."""


class EngineClosedError(EngineError):
    """generate()/update_weights() after close()."""


@attrs.frozen
class SamplingParams:
    """What to sample. `temperature == 0` is greedy; `top_k == 0` and `top_p == 1` disable truncation.

    `stop_token_ids` are added to the tokenizer's EOS; a stop token is kept as the last generated
    token (so the token stream equals what the chat template renders). `seed` makes one request
    reproducible on a given backend; `None` draws from the engine's generator.
    """

    max_tokens: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    temperature: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    top_p: float = attrs.field(default=1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)])
    top_k: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    seed: int | None = None
    n: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    ignore_eos: bool = False


@attrs.frozen
class Generation:
    """One sampled completion. `logprobs[i]` is the log-prob of `token_ids[i]`."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_len: int
    policy_version: int = 0


@runtime_checkable
class Engine(Protocol):
    tokenizer: PreTrainedTokenizerBase
    policy_version: int

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> Generation | list[Generation]: ...

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...

    async def close(self) -> None: ...


class BaseEngine(abc.ABC):
    """Shared plumbing: prompt validation, closed state, policy version, `async with`.

    Backends implement `_generate_one(prompt_ids, params) -> Generation` (or override
    `_generate_n`) and `_update_weights(named_tensors)`, `_close()`.
    """

    name = "base"

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int):
        self.tokenizer = tokenizer
        self.max_model_len = int(max_model_len)
        self.vocab_size = int(vocab_size)
        self.policy_version = 0
        self._closed = False

    # -- public API ----------------------------------------------------------------------------
    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> Generation | list[Generation]:
        """Sample `params.n` completions of `prompt_ids`; one Generation when n == 1, else a list."""
        params = params or SamplingParams()
        self._check_open()
        prompt = self.validate_prompt(prompt_ids)
        gens = await self._generate_n(prompt, params)
        return gens[0] if params.n == 1 else gens

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights (HF parameter names) and bump `policy_version`."""
        self._check_open()
        await self._update_weights(named_tensors)
        self.policy_version += 1

    def cache_stats(self) -> dict[str, int] | None:
        """Cumulative prefix-cache counters since start (``prefix_cache_queries``: prompt tokens
        looked up, ``prefix_cache_hits``: of those, found cached), or None where the backend has
        no prefix cache. Differences between two reads give a rollout's hit rate."""
        return None

    async def sleep(self) -> None:
        """Free what memory the backend can between rollouts (no-op where unsupported)."""
        return None

    async def wake(self) -> None:
        """Undo `sleep()`."""
        return None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- helpers for backends -------------------------------------------------------------------
    def validate_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        # One C-level pass through numpy: a per-token Python range check was the largest framework
        # cost per turn at multi-thousand-token prompts (benchmarks/README.md "Scaling"); this is ~2x
        # cheaper. Like int(), the conversion raises on non-numbers.
        ids = np.asarray(prompt_ids, dtype=np.int64)
        if ids.ndim != 1:
            raise InvalidPromptError(f"a prompt is a flat sequence of token ids, got shape {ids.shape}")
        if ids.size == 0:
            raise InvalidPromptError("empty prompt: generate() needs at least one prompt token")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            bad = ids[(ids < 0) | (ids >= self.vocab_size)].tolist()
            raise InvalidPromptError(
                f"prompt has {len(bad)} token id(s) outside the vocabulary [0, {self.vocab_size}): {bad[:5]}"
            )
        prompt = ids.tolist()
        if len(prompt) >= self.max_model_len:
            raise PromptTooLongError(
                f"prompt of {len(prompt)} tokens leaves no room to generate in the model's "
                f"context of {self.max_model_len} tokens"
            )
        return prompt

    def max_new_tokens(self, prompt_len: int, params: SamplingParams) -> int:
        """max_tokens clipped so prompt + completion fits the context (finish_reason 'length')."""
        return min(params.max_tokens, self.max_model_len - prompt_len)

    def stop_ids(self, params: SamplingParams) -> set[int]:
        ids = set(params.stop_token_ids)
        if not params.ignore_eos and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError(f"{self.name} engine is closed")

    @abc.abstractmethod
    async def _generate_n(self, prompt: list[int], params: SamplingParams) -> list[Generation]:
        """Sample `params.n` completions of an already validated prompt."""

    @abc.abstractmethod
    async def _update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors into the backend's model."""

    async def _close(self) -> None:
        return None
