"""ChatHandler: one episode's engine-backed ``chat.completions`` handler (what every transport calls).

    tracker = MessageTracker(engine.tokenizer)
    handler = ChatHandler(engine, tracker, defaults=SamplingDefaults(max_tokens=64))
    client = InProcessClient(handler, "episode-0")      # or ProxyServer.register(token, handler)
    await client.chat.completions.create(model="arl", messages=[...])
    tracker.step_samples()                              # the calls as exact token samples

Per call: the tracker turns the request's messages into prompt tokens (only new messages are
tokenized); the prompt must leave room for max_tokens; the engine generates (sampling fields the
request leaves unset come from ``defaults``; ``seed_for(call_index)``, when given, fixes the
per-call seed so a rerun reproduces the tokens); the tracker records the engine's exact tokens and
log-probs; the agent gets an `openai` ``ChatCompletion`` (tool calls parsed from ``<tool_call>``
blocks when it sent tools).

Where the reply ends (the loss mask at the boundary). The engine stops at its end-of-turn token,
at max_tokens, or at the first ``stop`` string, of any length (`SamplingParams.stop`: vLLM matches
it on its incremental text as tokens arrive and stops generating there; the other backends are
cut afterwards by `BaseEngine.generate`, `arl.engine.stops`; the handler applies the same cut to
a ``generate`` that did neither). At the match the sample keeps exactly the engine's tokens up to
and including the token that completed it (with their log-probs, mask 1); nothing after it is
sampled, trained or context (a prefix of a sample is itself a sample of the same policy), and
the template's end-of-turn follows with mask 0, as after a max_tokens cut
(`MessageTracker.commit`). The agent gets the text before the match (the API's rule; any text the
completing token decoded to beyond the match's start is not in the reply, though its token is in
the sample), finish_reason ``"stop"``. ``parallel_tool_calls:
false`` is honoured the same way: a reply with several tool calls is cut after the token that
closes the first one (``stats["parallel_tool_calls_cut"]``), so the agent never gets two calls
and the sample holds only what it got.

Constrained replies. ``response_format`` json_object / json_schema and a forcing ``tool_choice``
(``"required"``, a named tool) reach the engine as an `OutputConstraint` (`output_constraint`):
vLLM masks the tokens that would break it before each draw, so the reply meets it by
construction, and the sample keeps the sampled tokens with the log-probs of the *masked*
distribution (what was sampled from; a token the grammar forces has log-prob 0). The trainer's
policy is not masked, so on such tokens the PPO ratio p_new / p_old starts below 1 wherever the
mask removed probability (no behaviour-policy correction is made for it); the loss mask is the
usual one (every sampled token trained). ``stats["constrained_calls"]`` counts these calls. An
engine without constrained decoding (``supports_constraints`` false: the HF backend) gets no
such request: it is refused with a 400 naming the field. A constraint that does not compile (a
malformed schema: `InvalidConstraintError`) is a 400 too, code ``invalid_constraint``; the
episode goes on.

Images. A request whose user messages hold ``image_url`` parts (`arl.intercept.protocol`) is a
prompt with one image placeholder per image (`MessageTracker`); the engine's own renderer expands
it (`BaseEngine.render_images`, the one the managers use), the context check counts the expanded
ids, the engine is sent that `ImagePrompt`, and the handler checks that it ran exactly the
rendered ids and sampled no image placeholder (else the episode ends "engine_error"); the tracker
keeps the `RenderedPrompt` for the samples. An image PIL cannot decode (``unreadable_image``) or a
policy with no vision tower (``no_vision_tower``) is a 400 and the episode goes on; images that
fill the context are ``context_length_exceeded`` and end it "max_length", as a long text prompt does.

``stats`` counts those cuts (``stop_cuts``) and the request fields accepted but not acted on
(``noop_fields``, ``unknown_fields``: see `arl.intercept.protocol`); each such field name is
logged once per process as a warning (``logging.getLogger("arl.intercept.handler")``).

``responses`` is the episode's `ResponseStore`: the Responses-API replies
(`arl.intercept.responses`) a later request names by ``previous_response_id``; a Responses request
reaches ``__call__`` as the `ChatRequest` it converts to, so it is tracked like any chat call.

A failure that ends the episode is kept in ``handler.fault`` as ``(status, exit_reason, error)``
in the rollout vocabulary (prompt too long -> "max_length"; engine error or abort ->
"engine_error"; rejected prompt -> "invalid_prompt"), and the agent gets the matching OpenAI error.
After `close()` (or a fault) every call gets `EpisodeClosed` (410 over HTTP).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from arl.config import AGENT_SAMPLING
from arl.engine.base import (
    Generation,
    InvalidConstraintError,
    InvalidPromptError,
    NoVisionTowerError,
    PromptTooLongError,
    SampledWith,
    SamplingParams,
    UnreadableImageError,
)
from arl.engine.image_prompt import ImagePrompt, RenderedPrompt
from arl.engine.stops import first_prefix, stop_cut
from arl.intercept.protocol import (
    BadRequest,
    ChatRequest,
    ContextLengthExceeded,
    EngineFailure,
    EpisodeClosed,
    make_completion,
    output_constraint,
)
from arl.intercept.responses import ResponseStore
from arl.intercept.toolcalls import parse_tool_calls
from arl.intercept.tracker import MessageTracker, Prompt

Generate = Callable[[Sequence[int] | ImagePrompt, SamplingParams], Awaitable[Generation]]

_log = logging.getLogger(__name__)
_WARNED: set[str] = set()  # field names logged once per process (bounded: see _warn_field)


def _warn_field(kind: str, name: str) -> None:
    key = f"{kind}:{name[:100]}"
    if key in _WARNED or len(_WARNED) >= 1024:
        return
    _WARNED.add(key)
    what = "has no effect on arl's engines (a documented no-op)" if kind == "noop" else "is unknown to arl and ignored"
    _log.warning("request field %r %s; counted in ChatHandler.stats", name[:100], what)


@attrs.frozen
class SamplingDefaults:
    """Sampling settings for the fields a request leaves unset, and what to do with the ones it sets.

    ``agent_sampling``: ``"honour"`` draws at the request's ``temperature`` / ``top_p`` / ``top_k``
    where it sets them (an OpenAI-compatible server's behaviour); ``"override"`` draws at these
    values whatever the request says, and counts each field it overrode to a different value in
    ``ChatHandler.stats["sampling_overrides"]``. Either way the reply's tokens record what they were
    drawn at (`SampledWith`), so the trainer scores them at that. Training managers pass their
    config's choice (`arl.config.ManagerConfig.agent_sampling`; docs/guide.md says why it defaults
    to override there).
    """

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    agent_sampling: str = attrs.field(default="honour", validator=attrs.validators.in_(AGENT_SAMPLING))

    def resolve(self, request: ChatRequest) -> tuple[dict[str, Any], int]:
        """The temperature/top_p/top_k to draw at for ``request``, and how many of the fields the
        request set were overridden to a different value.

        >>> from types import SimpleNamespace as R
        >>> SamplingDefaults(temperature=1.0).resolve(R(temperature=0.1, top_p=None, top_k=None))
        ({'temperature': 0.1, 'top_p': 1.0, 'top_k': 0}, 0)
        >>> SamplingDefaults(agent_sampling="override").resolve(R(temperature=0.1, top_p=1.0, top_k=None))
        ({'temperature': 1.0, 'top_p': 1.0, 'top_k': 0}, 1)
        """
        out, overridden = {}, 0
        for name in ("temperature", "top_p", "top_k"):
            ours, asked = getattr(self, name), getattr(request, name)
            if asked is None:
                out[name] = ours
            elif self.agent_sampling == "honour":
                out[name] = asked
            else:
                out[name] = ours
                overridden += asked != ours
        return out, overridden


def _constraint_name(request: ChatRequest) -> str:
    if request.response_format is not None:
        return repr(request.response_format["type"])
    choice = request.tool_choice
    return "'required'" if choice == "required" else f"naming the tool {choice['function']['name']!r}"


class ChatHandler:
    """``await handler(episode_key, request) -> ChatCompletion`` for one episode (see the module doc)."""

    def __init__(
        self,
        engine: Any,
        tracker: MessageTracker,
        *,
        defaults: SamplingDefaults | None = None,
        max_model_len: int | None = None,
        seed_for: Callable[[int], int | None] | None = None,
        generate: Generate | None = None,  # default: engine.generate
        name: str | None = None,
    ) -> None:
        self.engine = engine
        self.tracker = tracker
        self.defaults = defaults or SamplingDefaults()
        self.max_model_len = max_model_len if max_model_len is not None else getattr(engine, "max_model_len", None)
        self.seed_for = seed_for
        self._generate = generate or self._engine_generate
        self.name = name  # the episode's name in errors and completion ids (default: the episode key)
        self.calls = 0  # model calls started (the index `seed_for` gets)
        self.closed = False
        self.fault: tuple[str, str, str] | None = None
        self.responses = ResponseStore()  # the episode's Responses-API replies, for previous_response_id
        self.stats: dict[str, int] = {"stop_cuts": 0, "parallel_tool_calls_cut": 0, "noop_fields": 0,
                                      "unknown_fields": 0, "constrained_calls": 0, "sampling_overrides": 0}

    def close(self) -> None:
        """The episode ended: later calls are refused with `EpisodeClosed`."""
        self.closed = True

    async def _engine_generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        gen = await self.engine.generate(prompt_ids, params)
        return gen[0] if isinstance(gen, list) else gen

    async def __call__(self, episode_key: str, request: ChatRequest) -> Any:
        label = self.name or episode_key  # over HTTP the episode key is a secret bearer token: never echo it
        if self.closed or self.fault is not None:
            reason = self.fault[1] if self.fault else "finished"
            raise EpisodeClosed(f"episode {label!r} has ended ({reason})")
        for kind, names in (("noop", request.noop), ("unknown", request.unknown)):
            for name in names:
                self.stats[f"{kind}_fields"] += 1
                _warn_field(kind, name)
        constraint = output_constraint(request)
        if constraint is not None and not getattr(self.engine, "supports_constraints", False):
            field = "response_format" if request.response_format is not None else "tool_choice"
            raise BadRequest(
                f"{field} {_constraint_name(request)} cannot be enforced: the "
                f"{getattr(self.engine, 'name', type(self.engine).__name__)} engine has no constrained decoding "
                "(the vllm backends have), and an unenforced constraint would train on replies the agent did "
                f"not ask for; omit {field} and check the reply in the agent", param=field)
        d, tokenizer = self.defaults, self.tracker.tokenizer
        prompt = self.tracker.prepare(request.messages, request.tools, normalized=True)  # parse_request did
        rendered = self._render(prompt) if prompt.images else None
        prompt_len = len(prompt.prompt_ids) if rendered is None else len(rendered.input_ids)
        max_tokens = request.max_tokens or d.max_tokens
        limit = self.max_model_len
        if limit is not None and prompt_len + max_tokens > limit:
            message = (f"prompt of {prompt_len} tokens + max_tokens {max_tokens} exceeds the "
                       f"model's context of {limit} tokens")
            self.fault = ("Finished", "max_length", message)
            raise ContextLengthExceeded(message)
        turn, self.calls = self.calls, self.calls + 1
        if constraint is not None:
            self.stats["constrained_calls"] += 1
        seed = self.seed_for(turn) if self.seed_for is not None else request.seed
        sampling, overridden = d.resolve(request)
        self.stats["sampling_overrides"] += overridden
        params = SamplingParams(
            max_tokens=max_tokens,
            **sampling,
            seed=seed,
            stop_token_ids=tuple(self.tracker.end_of_turn_ids[-1:]),
            stop=request.stop,
            constraint=constraint,
        )
        try:
            gen = await self._generate(prompt.prompt_ids if rendered is None else rendered.prompt, params)
        except InvalidConstraintError as exc:  # the agent's schema: its request is refused, the episode goes on
            field = "response_format" if request.response_format is not None else "tool_choice"
            raise BadRequest(f"{field}: {exc}", code="invalid_constraint", param=field) from exc
        except PromptTooLongError as exc:
            self.fault = ("Finished", "max_length", str(exc))
            raise ContextLengthExceeded(str(exc)) from exc
        except InvalidPromptError as exc:
            self.fault = ("Failed", "invalid_prompt", str(exc))
            raise BadRequest(str(exc), code="invalid_prompt") from exc
        except Exception as exc:  # EngineError or an engine bug: the episode cannot go on
            self.fault = ("Failed", "engine_error", f"{type(exc).__name__}: {exc}")
            raise EngineFailure(f"engine failed: {type(exc).__name__}: {exc}") from exc
        if gen.finish_reason == "abort":
            self.fault = ("Failed", "engine_error", "the engine aborted the request")
            raise EngineFailure("the engine aborted the request")
        if rendered is not None:
            self._check_image_generation(rendered, gen)
        ids, lps, reason = gen.token_ids, gen.logprobs, gen.finish_reason  # cuts below slice them

        def decode(tokens: Sequence[int]) -> str:
            return tokenizer.decode(tokens, skip_special_tokens=True)

        stops = request.stop
        k = stop_cut(ids, decode, stops)  # the engine stopped there already; a generate() that did not is cut
        stopped_by_string = k is not None
        if k is not None:
            ids, lps, reason = ids[:k], lps[:k], "stop"
        text = decode(ids)
        if k is not None:  # the reply's text ends before the match (the module doc)
            text = text[: min((text.find(s) for s in stops if s in text), default=len(text))]
            self.stats["stop_cuts"] += 1
        calls: list[dict[str, Any]] = []
        content: str | None = text
        if request.tools and request.tool_choice != "none":
            content, calls = parse_tool_calls(text, id_prefix=f"call_{turn}")
            if len(calls) > 1 and request.parallel_tool_calls is False:  # keep the first call only
                k = first_prefix(ids, decode, lambda t: bool(parse_tool_calls(t)[1]))
                ids, lps, reason = ids[:k], lps[:k], "stop"
                content, calls = parse_tool_calls(decode(ids), id_prefix=f"call_{turn}")
                calls = calls[:1]
                self.stats["parallel_tool_calls_cut"] += 1
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = calls
        self.tracker.commit(prompt, ids, lps, reason, reply, gen.policy_version,
                            sampled_with=SampledWith.of(params, stopped_by_string=stopped_by_string), rendered=rendered)
        finish = "length" if reason == "length" else ("tool_calls" if calls else "stop")
        token_logprobs = None
        if request.logprobs:
            pieces = tokenizer.convert_ids_to_tokens(list(ids))
            token_logprobs = list(zip(pieces, lps, strict=True))
        return make_completion(
            completion_id=f"chatcmpl-{label}-{turn}", model=request.model, content=content, tool_calls=calls,
            finish_reason=finish, prompt_tokens=prompt_len, completion_tokens=len(ids),
            token_logprobs=token_logprobs,
        )

    def _render(self, prompt: Prompt) -> RenderedPrompt:
        """The engine's rendering of a prompt with images (`BaseEngine.render_images`: its one
        renderer expands each placeholder and computes the pixels). An image the processor cannot
        read, or a policy with no vision tower, is a 400 and the episode goes on (the agent may send
        another); images that fill the context end it ``max_length``, as a text prompt does."""
        engine = self.engine
        try:
            if getattr(engine, "image_renderer", None) is None:
                raise NoVisionTowerError(
                    f"the {getattr(engine, 'name', type(engine).__name__)} engine's model has no vision tower: it "
                    "cannot be shown images (serve a VLM, e.g. the zoo's tiny-vl)")
            return engine.render_images(ImagePrompt(prompt.prompt_ids, prompt.images))  # type: ignore[no-any-return]
        except (NoVisionTowerError, UnreadableImageError) as exc:
            code = "no_vision_tower" if isinstance(exc, NoVisionTowerError) else "unreadable_image"
            raise BadRequest(str(exc), code=code, param="messages") from exc
        except PromptTooLongError as exc:  # TooManyImagesError: no room left to generate
            self.fault = ("Finished", "max_length", str(exc))
            raise ContextLengthExceeded(str(exc)) from exc
        except InvalidPromptError as exc:  # e.g. an image placeholder token typed into the text
            self.fault = ("Failed", "invalid_prompt", str(exc))
            raise BadRequest(str(exc), code="invalid_prompt") from exc

    def _check_image_generation(self, rendered: RenderedPrompt, gen: Generation) -> None:
        """The engine ran the ids the tracker's samples will carry, and sampled no image placeholder
        (a forward would take it for an image's slot): else the episode ends engine_error."""
        if gen.prompt_token_ids is None or tuple(gen.prompt_token_ids) != tuple(rendered.input_ids):
            message = (f"the engine ran {gen.prompt_len} prompt ids, not the {len(rendered.input_ids)} expanded ids "
                       "rendered for the request: image features and image tokens would not match")
        elif rendered.image_token_id in gen.token_ids:
            message = (f"the model sampled the image placeholder token (id {rendered.image_token_id}) in its reply: "
                       "a sample with it cannot be scored (its image tokens would not match)")
        else:
            return
        self.fault = ("Failed", "engine_error", message)
        raise EngineFailure(message)


__all__ = ["ChatHandler", "Generate", "SamplingDefaults"]
