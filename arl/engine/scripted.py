"""Scripted backend: instant, deterministic answers without a model.

Used to test env managers without a model and to measure framework overhead. It cannot mask
tokens, so a request with an output constraint (`SamplingParams.constraint`) gets the scripted
reply only if the reply meets it (checked with xgrammar, `arl.engine.grammar`); otherwise the
request fails with an EngineError naming the first offending token: a test whose script breaks
the format it asks for fails loudly instead of passing on a reply vLLM could never have sampled. Every random choice
(which action, whether the answer is invalid, whether the request fails, the log-probs) is a pure
function of (engine seed, request seed, prompt token ids, completion index), hashed with BLAKE2:
the same prompt gets the same answer whatever the request order or concurrency, so two managers
driven by the same seeds see the same samples.

Images: a scripted engine whose tokenizer knows ``<|image_pad|>`` (the zoo's tiny-vl) takes
`ImagePrompt`s with fake pixels (`arl.engine.images.fake_pixels`: ``image_tokens`` image tokens an
image, pixels from the image itself), so managers can be tested on images without a model. Its
answer depends on the expanded ids and the pixels: two different frames get independent answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

import attrs
import numpy as np

from arl.engine.base import BaseEngine, EngineError, FinishReason, Generation, LoRAAdapter, SamplingParams

if TYPE_CHECKING:
    from arl.config import EngineConfig

Mode = Literal["random_actions", "responses"]

# Replies the env parsers reject: no tags, an unknown action, two answers.
INVALID_ANSWERS = (
    "I think I will go up",
    "<answer>Jump</answer>",
    "<answer>Up</answer><answer>Down</answer>",
)

# config.scripted keys -> constructor arguments (all of them, under the same names).
OPTIONS = ("responses", "mode", "actions", "invalid_rate", "logprob", "latency_s", "fail_rate", "answer_format",
           "image_tokens")


class _FakeRenderer:
    """The scripted engine's `image_renderer`: `fake_pixels` with the tokenizer's image placeholder."""

    def __init__(self, image_token_id: int, tokens_per_image: int):
        self.image_token_id = image_token_id
        self.tokens_per_image = tokens_per_image

    def render(self, prompt: Any) -> Any:
        from arl.engine.images import fake_pixels

        return fake_pixels(prompt, self.image_token_id, self.tokens_per_image)


class ScriptedEngine(BaseEngine):
    """Answers from a script (`responses`) or random `<answer>{action}</answer>` replies."""

    name = "scripted"

    @property
    def supports_constraints(self) -> bool:  # checked, not enforced: see the module doc
        from arl.engine.grammar import available

        return available()

    def __init__(
        self,
        tokenizer: Any,
        *,
        responses: Sequence[str] | Callable[[str], str] | None = None,
        mode: Mode = "random_actions",
        actions: Sequence[str] = ("Up", "Down", "Left", "Right"),
        invalid_rate: float = 0.0,
        seed: int = 0,
        max_model_len: int = 2048,
        logprob: float | None = None,
        latency_s: float = 0.0,
        fail_rate: float = 0.0,
        answer_format: str = "<answer>{action}</answer>",
        image_tokens: int = 4,
    ):
        """`responses` (a list cycled in order, or `f(prompt_text) -> str`) switches to mode
        "responses". `logprob=None` gives hashed log-probs in [-3, 0]; a float gives that constant.
        `latency_s` sleeps per request; `fail_rate` is the chance a request raises EngineError.
        `answer_format` shapes a random valid reply from ``{action}`` (e.g. a ``<tool_call>`` block
        for agents that act through function calls). `image_tokens`: the image tokens each image of
        an image prompt expands to (a tokenizer with ``<|image_pad|>`` only)."""
        if mode not in get_args(Mode):
            expected = " or ".join(map(repr, get_args(Mode)))
            raise ValueError(f"unknown scripted mode {mode!r}; expected {expected}")
        if responses is not None:
            mode = "responses"
        if mode == "responses" and responses is None:
            raise ValueError("mode 'responses' needs `responses` (a list of strings or a callable)")
        if isinstance(responses, str) or (
            responses is not None and not callable(responses) and len(responses) == 0
        ):
            raise ValueError("responses must be a non-empty list of strings or a callable")
        if not actions:
            raise ValueError("actions must not be empty")
        if "{action}" not in answer_format:
            raise ValueError(f"answer_format must contain '{{action}}', got {answer_format!r}")
        for name, rate in (("invalid_rate", invalid_rate), ("fail_rate", fail_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate}")
        if logprob is not None and not logprob <= 0.0:
            raise ValueError(f"logprob must be <= 0, got {logprob}")
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        super().__init__(tokenizer, max_model_len, len(tokenizer))
        self.mode: Mode = mode
        self.responses = responses if responses is None or callable(responses) else list(responses)
        self.actions = tuple(actions)
        self.invalid_rate = float(invalid_rate)
        self.seed = int(seed)
        self.logprob = logprob
        self.latency_s = float(latency_s)
        self.fail_rate = float(fail_rate)
        self.answer_format = answer_format
        self._cursor = itertools.count()  # position in a response list (shared by all requests)
        self.requests = 0  # served requests (failed ones included)
        self.weight_updates = 0
        self.tensors_received = 0
        self.adapter_updates = 0  # LoRA pushes: counted, never applied (there is no model)
        self.adapter_bytes_received = 0
        if int(image_tokens) < 1:
            raise ValueError(f"image_tokens must be >= 1, got {image_tokens}")
        pad = tokenizer.convert_tokens_to_ids("<|image_pad|>") if hasattr(tokenizer, "convert_tokens_to_ids") else None
        if isinstance(pad, int) and pad != getattr(tokenizer, "unk_token_id", None) and 0 <= pad < self.vocab_size:
            self.image_renderer = _FakeRenderer(pad, int(image_tokens))  # type: ignore[assignment]

    @classmethod
    def from_config(cls, config: EngineConfig) -> ScriptedEngine:
        """Tokenizer of `config.model` (never its weights) + `config.scripted` options."""
        from transformers import AutoTokenizer

        from arl.models import resolve_model

        unknown = sorted(set(config.scripted) - set(OPTIONS))
        if unknown:
            raise ValueError(f"unknown scripted option(s) {unknown}; known: {list(OPTIONS)}")
        options = dict(config.scripted)
        if "actions" in options:
            options["actions"] = tuple(options["actions"])
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(config.model))
        return cls(tokenizer, seed=config.seed, max_model_len=config.max_model_len, **options)

    # -- engine ------------------------------------------------------------------------------------
    async def _generate_n(self, prompt: list[int], params: SamplingParams,
                          key: list[int] | None = None) -> list[Generation]:
        """``key``: what the random choices hash instead of ``prompt`` (an image prompt's ids + pixels)."""
        self.requests += 1
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        self._check_open()  # closed while sleeping
        if self.fail_rate > 0 and self._rng(key or prompt, params, "fail").random() < self.fail_rate:
            raise EngineError("scripted engine failure (fail_rate)")
        gens = [self._complete(prompt, params, i, key) for i in range(params.n)]
        for gen in gens:
            self._check_forbidden(gen)
        if params.constraint is not None:
            for gen in gens:
                self._check_constraint(gen, params)
        return gens

    async def _generate_images_n(self, rendered: Any, params: SamplingParams) -> list[Generation]:
        ids = list(rendered.input_ids)
        digest = hashlib.blake2b(np.ascontiguousarray(rendered.pixel_values).tobytes(), digest_size=16).digest()
        key = ids + [int(x) for x in np.frombuffer(digest, dtype=np.uint32)]  # the answer depends on the image too
        gens = await self._generate_n(ids, params, key=key)
        return [attrs.evolve(g, prompt_token_ids=rendered.input_ids) for g in gens]

    async def _update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        self.tensors_received += sum(1 for _ in named_tensors)
        self.weight_updates += 1

    async def _update_adapter(self, adapter: LoRAAdapter) -> None:
        self.tensors_received += len(adapter.tensors)
        self.adapter_bytes_received += adapter.nbytes
        self.adapter_updates += 1

    # -- helpers -----------------------------------------------------------------------------------
    def _check_constraint(self, gen: Generation, params: SamplingParams) -> None:
        from arl.engine.grammar import first_violation

        assert params.constraint is not None
        k = first_violation(self.tokenizer, self.vocab_size, params.constraint, gen.token_ids, self.stop_ids(params))
        if k is not None:
            good = self.tokenizer.decode(gen.token_ids[:k])
            bad = self.tokenizer.decode(gen.token_ids[k : k + 1])
            raise EngineError(
                f"the scripted reply breaks the request's {params.constraint.kind} constraint at token {k} "
                f"({bad!r} after {good[-60:]!r}); a real engine would have masked it: script a reply that "
                "meets the constraint")
    def _check_forbidden(self, gen: Generation) -> None:
        """A scripted reply holding a token no VLM may sample (`forbidden_token_ids`) fails its request,
        as a broken constraint does: vLLM and HF would never have sampled it."""
        forbidden = set(self.forbidden_token_ids)
        k = next((k for k, t in enumerate(gen.token_ids) if t in forbidden), None)
        if k is not None:
            token = gen.token_ids[k]
            what = "the image placeholder token" if token == self.image_renderer.image_token_id else "a vision token"
            raise EngineError(
                f"the scripted reply holds {what} {self.tokenizer.decode([token])!r} (id {token}) at position {k}: "
                "a VLM's engine never samples its vision tokens; script a reply without them")

    def _rng(self, prompt: list[int], params: SamplingParams, tag: str | int) -> np.random.Generator:
        """A generator that depends on (engine seed, request seed, prompt, tag) and nothing else."""
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.seed}|{params.seed}|{tag}|".encode())
        h.update(np.asarray(prompt, dtype=np.int64).tobytes())
        return np.random.default_rng(int.from_bytes(h.digest(), "little"))

    def response_text(self, prompt: list[int], params: SamplingParams, index: int = 0,
                      key: list[int] | None = None) -> str:
        """The text completion `index` of this request answers (before tokenization/truncation);
        ``key`` (default ``prompt``) is what the random choices hash."""
        if self.mode == "responses":
            if callable(self.responses):
                return str(self.responses(self.tokenizer.decode(prompt)))
            assert self.responses is not None
            return self.responses[next(self._cursor) % len(self.responses)]
        rng = self._rng(key or prompt, params, index)
        # Always draw both numbers, so invalid_rate does not shift which action a valid reply gets.
        invalid, pick = rng.random(), rng.random()
        if invalid < self.invalid_rate:
            return INVALID_ANSWERS[int(pick * len(INVALID_ANSWERS))]
        return self.answer_format.replace("{action}", self.actions[int(pick * len(self.actions))])

    def _complete(self, prompt: list[int], params: SamplingParams, index: int,
                  key: list[int] | None = None) -> Generation:
        ids = list(self.tokenizer.encode(self.response_text(prompt, params, index, key), add_special_tokens=False))
        stops = self.stop_ids(params)
        eos = self.tokenizer.eos_token_id
        budget = self.max_new_tokens(len(prompt), params)
        if not params.ignore_eos and eos is not None:
            ids.append(int(eos))
        elif ids:
            # Told not to stop at EOS, a model keeps talking until max_tokens: repeat the script.
            ids = (ids * (budget // len(ids) + 1))[:budget]
        reason: FinishReason = "length"
        for k, tok in enumerate(ids[:budget]):
            if tok in stops:  # a stop token inside the text ends it there, as a model would
                ids, reason = ids[: k + 1], "stop"
                break
        else:
            ids = ids[:budget]
        if self.logprob is not None:
            lps = [float(self.logprob)] * len(ids)
        else:
            u = self._rng(key or prompt, params, f"lp{index}").random(len(ids))
            lps = [float(math.log(0.05 + 0.95 * x)) for x in u]  # in [log 0.05, 0] ~ [-3, 0]
        return Generation(ids, lps, reason, len(prompt), self.policy_version)
