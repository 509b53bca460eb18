"""The engine contract every backend implements (docs/architecture.md §5).

Token-in / token-out: `generate()` takes prompt token ids and returns the generated token ids
with one log-prob per token (after temperature, i.e. the distribution actually sampled from).
A prompt may also be an `arl.engine.images.ImagePrompt` (token ids + the images they refer to):
the engine's `image_renderer` expands it once, the backend runs the expanded ids with the pixels,
and each Generation reports the ids it ran (``prompt_token_ids``).
Errors are typed so the rollout boundary can turn them into data.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args, runtime_checkable

import attrs
import numpy as np

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from arl.engine.image_prompt import ImagePrompt, RenderedPrompt, Renderer

FinishReason = Literal["stop", "length", "abort"]
ConstraintKind = Literal["json_object", "json_schema", "structural_tag"]
CONSTRAINT_KINDS: tuple[str, ...] = get_args(ConstraintKind)


class EngineError(RuntimeError):
    """An engine failed to serve a request (the request is lost, the engine may still serve)."""


class InvalidPromptError(EngineError, ValueError):
    """The prompt cannot be served: empty, token ids out of vocabulary, or too long."""


class PromptTooLongError(InvalidPromptError):
    """prompt_len + 1 exceeds the model's context: not even one token can be generated."""


class UnreadableImageError(InvalidPromptError):
    """An image the processor cannot read: not a PIL image, an RGB/grey uint8 array, encoded image
    bytes or a ``data:image/...;base64,`` URL, or bytes PIL cannot decode."""


class NoVisionTowerError(InvalidPromptError):
    """An image prompt for a model with no vision tower (a text-only model)."""


class TooManyImagesError(PromptTooLongError):
    """The images expand the prompt past the model's context (no room left to generate)."""


class InvalidConstraintError(EngineError, ValueError):
    """The request's `OutputConstraint` cannot be compiled (a malformed JSON schema, a broken
    structural tag): the request is refused before anything is generated; the engine serves on."""


class EngineClosedError(EngineError):
    """generate()/update_weights() after close()."""


class EngineUnsupportedError(EngineError, ValueError):
    """The engine cannot start as configured on this machine (e.g. sleep mode without CUDA)."""


def _check_spec(instance: Any, attribute: Any, spec: Any) -> None:
    kind = instance.kind
    if kind == "json_object" and spec is not None:
        raise ValueError("a json_object constraint takes no spec")
    if kind in ("json_schema", "structural_tag") and not isinstance(spec, dict):
        raise ValueError(f"a {kind} constraint needs its spec as a dict, got {type(spec).__name__}")


@attrs.frozen
class OutputConstraint:
    """What a reply must match, enforced while sampling (constrained decoding: tokens that would
    break it are masked out before the draw, so the log-probs are those of the masked
    distribution, the one sampled from).

    ``kind``: ``"json_object"`` (any JSON object; ``spec`` None), ``"json_schema"`` (``spec`` a JSON
    schema) or ``"structural_tag"`` (``spec`` an xgrammar structural tag: free text with tagged
    regions that must match a schema, how tool calls are forced; see
    `arl.intercept.toolcalls.tool_call_tag`). Only backends with ``supports_constraints`` take one.
    """

    kind: ConstraintKind = attrs.field(validator=attrs.validators.in_(CONSTRAINT_KINDS))
    spec: dict[str, Any] | None = attrs.field(default=None, validator=_check_spec, eq=False, hash=False)


@attrs.frozen
class SamplingParams:
    """What to sample. `temperature == 0` is greedy; `top_k == 0` and `top_p == 1` disable truncation.

    `stop_token_ids` are added to the tokenizer's EOS; a stop token is kept as the last generated
    token (so the token stream equals what the chat template renders). `stop` strings end the
    reply at the token that completes the first match on the decoded text (kept; `arl.engine.stops`).
    `seed` makes one request
    reproducible on a given backend; `None` draws from the engine's generator. Greedy requests report
    the log-probs of the unscaled distribution (temperature 1), the one the argmax picks from (the
    weight-sync canary, arl/train/canary.py, relies on it). `constraint` restricts the reply to a
    format (`OutputConstraint`) on backends that can enforce it; the others refuse the request.
    """

    max_tokens: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    temperature: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    top_p: float = attrs.field(default=1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)])
    top_k: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    seed: int | None = None
    n: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    ignore_eos: bool = False
    constraint: OutputConstraint | None = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @stop.validator
    def _check_stop(self, attribute: Any, value: tuple[str, ...]) -> None:
        if not all(isinstance(s, str) and s for s in value):
            raise ValueError(f"stop strings must be non-empty strings, got {value!r}")


@attrs.frozen
class SampledWith:
    """How one reply's tokens were drawn: what the trainer needs to score them as they were sampled.

    The trainer recomputes each token's log-prob at its own ``temperature`` (a greedy draw,
    ``temperature == 0``, is scored at 1: the engine reports the unscaled distribution for it, see
    `SamplingParams`). What it cannot reproduce is recorded so it can be counted, not hidden: a
    truncation (``top_p < 1`` or ``top_k > 0``: the engine renormalised over a subset the trainer's
    full softmax does not see), a ``constrained`` draw (an `OutputConstraint` masked tokens out), and
    a reply a stop string ended (``stopped_by_string``: its last tokens are the match, its end is the
    string's, not the model's end-of-turn).

    >>> SampledWith.of(SamplingParams(temperature=0.3, top_p=0.9))
    SampledWith(temperature=0.3, top_p=0.9, top_k=0, constrained=False, stopped_by_string=False)
    >>> SampledWith(temperature=0.0).scoring_temperature, SampledWith(top_k=50).truncated
    (1.0, True)
    """

    temperature: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    top_p: float = 1.0
    top_k: int = 0
    constrained: bool = False
    stopped_by_string: bool = False

    @classmethod
    def of(cls, params: SamplingParams, *, stopped_by_string: bool = False) -> SampledWith:
        return cls(params.temperature, params.top_p, params.top_k, params.constraint is not None, stopped_by_string)

    @property
    def truncated(self) -> bool:
        """The draw came from a top-p/top-k truncated distribution (greedy is not a truncation:
        its log-probs are the full distribution's)."""
        return self.temperature > 0 and (self.top_p < 1.0 or self.top_k > 0)

    @property
    def scoring_temperature(self) -> float:
        """The temperature the trainer divides the logits by to get the engine's log-probs."""
        return self.temperature if self.temperature > 0 else 1.0


@attrs.frozen
class Generation:
    """One sampled completion. `logprobs[i]` is the log-prob of `token_ids[i]`.

    ``prompt_token_ids``: the prompt ids the backend actually ran where they differ from the ids
    given, i.e. an image prompt's ids with each image placeholder expanded to its image tokens
    (vLLM: ``RequestOutput.prompt_token_ids``); None for a plain token prompt (it ran as given).
    ``prompt_len`` counts the ids that ran.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_len: int
    policy_version: int = 0
    prompt_token_ids: tuple[int, ...] | None = None


ADAPTER_CONFIG = "adapter_config.json"  # peft's file names: vLLM and `PeftModel.from_pretrained` read them
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@attrs.frozen(eq=False)
class LoRAAdapter:
    """A LoRA adapter as peft writes it: ``config`` is adapter_config.json (``r``, ``lora_alpha``,
    ``target_modules``, ...), ``tensors`` the peft state dict (``base_model.model.<module>.lora_A.weight``
    and ``lora_B``). ``merged`` (optional) returns the full HF-named weights with the adapter folded
    in: what a backend without a LoRA path loads instead (`BaseEngine._update_adapter`).
    """

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    merged: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None

    @property
    def rank(self) -> int:
        return int(self.config["r"])

    @property
    def nbytes(self) -> int:
        """Bytes of adapter weights a push moves."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the peft directory (adapter_config.json + adapter_model.safetensors) vLLM loads."""
        from safetensors.torch import save_file

        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: t.detach().to("cpu").contiguous() for k, t in self.tensors.items()}, path / ADAPTER_WEIGHTS)
        (path / ADAPTER_CONFIG).write_text(json.dumps(self.config, indent=2, default=_json_default))
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> LoRAAdapter:
        """Read a peft adapter directory (e.g. an arl LoRA checkpoint); it carries no merged weights."""
        from safetensors.torch import load_file

        path = Path(directory)
        return cls(json.loads((path / ADAPTER_CONFIG).read_text()), load_file(path / ADAPTER_WEIGHTS))


def _json_default(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):  # peft keeps target_modules as a set
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


@runtime_checkable
class Engine(Protocol):
    tokenizer: PreTrainedTokenizerBase
    policy_version: int

    async def generate(
        self, prompt_ids: Sequence[int] | ImagePrompt, params: SamplingParams
    ) -> Generation | list[Generation]: ...

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *,
                             keep_kv: bool = False) -> None: ...

    async def update_adapter(self, adapter: LoRAAdapter | str | os.PathLike[str]) -> None: ...

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...

    async def close(self) -> None: ...


class BaseEngine(abc.ABC):
    """Shared plumbing: prompt validation, closed state, policy version, `async with`.

    Backends implement `_generate_n(prompt, params) -> list[Generation]` (``params.n`` completions
    of an already validated prompt) and `_update_weights(named_tensors)`, `_close()`; those with a LoRA path
    override `_update_adapter(adapter)` (the default loads the adapter's merged weights).
    """

    name = "base"
    supports_constraints = False  # can it enforce SamplingParams.constraint (constrained decoding)?
    # Renders image prompts (`arl.engine.images`); None: the model has no vision tower. A backend
    # serving a VLM sets it; those that take images implement `_generate_images_n`.
    image_renderer: Renderer | None = None
    native_stop_strings = False  # does the backend stop at SamplingParams.stop itself? else cut afterwards
    # does the backend keep prompt KV across requests (a prefix cache), so that `update_weights(...,
    # keep_kv=True)` has something to keep? Those without one compute every prompt afresh.
    caches_prefixes = False

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int):
        self.tokenizer = tokenizer
        self.max_model_len = int(max_model_len)
        self.vocab_size = int(vocab_size)
        self.policy_version = 0
        self._closed = False
        self._asleep = False  # between sleep() and wake() of an engine started with sleep mode

    # -- public API ----------------------------------------------------------------------------
    async def generate(
        self, prompt_ids: Sequence[int] | ImagePrompt, params: SamplingParams | None = None
    ) -> Generation | list[Generation]:
        """Sample `params.n` completions of `prompt_ids`; one Generation when n == 1, else a list.
        An `ImagePrompt` is rendered first (`render_images`); its Generations carry the expanded ids."""
        params = params or SamplingParams()
        self._check_open()
        if params.constraint is not None:
            if not self.supports_constraints:
                raise EngineUnsupportedError(
                    f"the {self.name} engine has no constrained decoding: it cannot enforce a "
                    f"{params.constraint.kind} constraint (the vllm backends can)")
            self.check_constraint(params)
        from arl.engine.image_prompt import ImagePrompt

        if isinstance(prompt_ids, ImagePrompt):
            rendered = self.render_images(prompt_ids)
            gens = await self._generate_images_n(rendered, params)
            for gen in gens:  # the ids the trainer will score must be the ids that ran
                if gen.prompt_token_ids != rendered.input_ids:
                    raise EngineError(
                        f"the {self.name} engine ran {gen.prompt_len} prompt ids that differ from the renderer's "
                        f"{len(rendered.input_ids)} expanded ids: image features and image tokens would not match")
        else:
            prompt = self.validate_prompt(prompt_ids)
            gens = await self._generate_n(prompt, params)
        if params.stop and not self.native_stop_strings:
            gens = [self._cut_at_stop(gen, params.stop) for gen in gens]
        return gens[0] if params.n == 1 else gens

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *,
                             keep_kv: bool = False) -> None:
        """Load new policy weights (HF parameter names) and bump `policy_version`.

        The KV cached for earlier prompts was computed by the old weights: by default it is dropped,
        so every later prompt is computed afresh under the new ones (recompute). ``keep_kv=True``
        keeps it, so a prompt that extends a cached prefix (a partial rollout's resumed episode,
        `arl.rollout.partial`) reuses KV of the old policy: only backends with a prefix cache
        (``caches_prefixes``) can, the others refuse (`EngineUnsupportedError`) rather than
        silently recompute."""
        self._check_open()
        if keep_kv:
            if not self.caches_prefixes:
                raise EngineUnsupportedError(
                    f"the {self.name} engine keeps no KV across requests (no prefix cache): there is no KV to keep "
                    "after a weight push, every prompt is recomputed (rollout.partial.kv: recompute)")
            await self._update_weights(named_tensors, keep_kv=True)  # type: ignore[call-arg]
        else:
            await self._update_weights(named_tensors)
        self.policy_version += 1

    async def update_adapter(self, adapter: LoRAAdapter | str | os.PathLike[str]) -> None:
        """Serve base weights + this LoRA adapter (a `LoRAAdapter` or a peft adapter directory) from
        now on, and bump `policy_version`. Backends with a LoRA path move only the adapter; the
        others load its merged weights. `update_weights` afterwards replaces the whole policy (the
        adapter is dropped)."""
        self._check_open()
        if not isinstance(adapter, LoRAAdapter):
            adapter = LoRAAdapter.load(adapter)
        await self._update_adapter(adapter)
        self.policy_version += 1

    def engine_stats(self) -> dict[str, float] | None:
        """Cumulative counters since start, or None where the backend keeps none (in-process vLLM
        does): ``prefix_cache_queries`` (prompt tokens looked up), ``prefix_cache_hits`` (of those,
        found cached), ``engine_steps`` (scheduler iterations) and ``engine_busy_s`` (seconds spent
        in them). Differences between two reads describe a rollout: its hit rate, and whether the
        engine was the bottleneck (busy nearly all the time) or waited on the envs and the framework."""
        return None

    async def sleep(self) -> None:
        """Free what memory the backend can between rollouts (no-op where unsupported)."""
        return None

    async def wake(self) -> None:
        """Undo `sleep()`."""
        return None

    @property
    def asleep(self) -> bool:
        return self._asleep

    def _check_awake(self) -> None:
        if self._asleep:  # vLLM's offloaded weights would not take the new ones
            raise EngineError("the engine is asleep: wake() it before loading weights or adapters")

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
        # cost per turn at multi-thousand-token prompts (benchmarks/HISTORY.md "Scaling"); this is ~2x
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

    def render_images(self, prompt: ImagePrompt) -> RenderedPrompt:
        """``prompt`` expanded by this engine's `image_renderer` and checked like a token prompt:
        `NoVisionTowerError` (no renderer: a text-only model), `UnreadableImageError`,
        `TooManyImagesError` (no room left in the context), `InvalidPromptError` (ids out of the
        vocabulary, placeholders and images that do not pair up)."""
        from arl.engine.images import check_context

        if self.image_renderer is None:
            raise NoVisionTowerError(
                f"the {self.name} engine's model has no vision tower: it cannot be shown images "
                "(serve a VLM, e.g. the zoo's tiny-vl)")
        rendered = self.image_renderer.render(prompt)
        check_context(rendered, self.max_model_len)
        self.validate_prompt(rendered.input_ids)
        return rendered

    def max_new_tokens(self, prompt_len: int, params: SamplingParams) -> int:
        """max_tokens clipped so prompt + completion fits the context (finish_reason 'length')."""
        return min(params.max_tokens, self.max_model_len - prompt_len)

    @property
    def forbidden_token_ids(self) -> tuple[int, ...]:
        """Token ids this engine never samples: a VLM's vision tokens (`arl.models.tiny_vl.vision_token_ids`:
        a sampled image placeholder is an image slot with no image, which no forward can score), () for a
        text model. Backends enforce it (vLLM ``bad_words``, HF a logit mask, scripted a refusal)."""
        if self.image_renderer is None:
            return ()
        cached = self.__dict__.get("_forbidden_token_ids")
        if cached is None:
            from arl.models.tiny_vl import vision_token_ids

            cached = self.__dict__["_forbidden_token_ids"] = vision_token_ids(self.tokenizer)
        return cached

    def stop_ids(self, params: SamplingParams) -> set[int]:
        ids = set(params.stop_token_ids)
        if not params.ignore_eos and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def check_constraint(self, params: SamplingParams) -> None:
        """Compile ``params.constraint`` with xgrammar, the grammar engine vLLM uses (cached per
        constraint), so a malformed one is an `InvalidConstraintError` before the request reaches
        the backend (vLLM's own refusal would read as an invalid prompt)."""
        from arl.engine.grammar import compile_constraint

        assert params.constraint is not None
        try:
            compile_constraint(self.tokenizer, self.vocab_size, params.constraint, self.stop_ids(params))
        except EngineUnsupportedError:
            raise
        except Exception as exc:  # noqa: BLE001 -- xgrammar raises RuntimeError / ValueError / its own types
            raise InvalidConstraintError(
                f"the {params.constraint.kind} constraint does not compile: {str(exc)[:300]}") from exc

    def _cut_at_stop(self, gen: Generation, stops: tuple[str, ...]) -> Generation:
        """``gen`` ended where a backend that stops on text would have ended it (`arl.engine.stops`)."""
        from arl.engine.stops import stop_cut

        def decode(ids: Sequence[int]) -> str:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        k = stop_cut(gen.token_ids, decode, stops)
        if k is None:
            return gen
        return attrs.evolve(gen, token_ids=gen.token_ids[:k], logprobs=gen.logprobs[:k], finish_reason="stop")

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError(f"{self.name} engine is closed")

    @abc.abstractmethod
    async def _generate_n(self, prompt: list[int], params: SamplingParams) -> list[Generation]:
        """Sample `params.n` completions of an already validated prompt."""

    async def _generate_images_n(self, rendered: RenderedPrompt, params: SamplingParams) -> list[Generation]:
        """Sample `params.n` completions of a rendered image prompt (each Generation's
        ``prompt_token_ids`` the ids the backend ran). Backends that take images override it."""
        raise EngineUnsupportedError(f"the {self.name} engine does not take image prompts (the vllm, vllm-async, "
                                     "hf and scripted engines do)")

    @abc.abstractmethod
    async def _update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors into the backend's model."""

    async def _update_adapter(self, adapter: LoRAAdapter) -> None:
        """No LoRA path: load the merged weights (base + scale * B @ A) instead."""
        if adapter.merged is None:
            raise EngineError(
                f"the {self.name} engine has no LoRA path here and this adapter carries no merged weights "
                "(build the adapter from the trained model, or start the engine with LoRA enabled)"
            )
        await self._update_weights(adapter.merged())

    async def _close(self) -> None:
        return None
