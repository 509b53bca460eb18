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

A failure that ends the episode is kept in ``handler.fault`` as ``(status, exit_reason, error)``
in the rollout vocabulary (prompt too long -> "max_length"; engine error or abort ->
"engine_error"; rejected prompt -> "invalid_prompt"), and the agent gets the matching OpenAI error.
After `close()` (or a fault) every call gets `EpisodeClosed` (410 over HTTP).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from arl.engine.base import Generation, InvalidPromptError, PromptTooLongError, SamplingParams
from arl.intercept.protocol import (
    BadRequest,
    ChatRequest,
    ContextLengthExceeded,
    EngineFailure,
    EpisodeClosed,
    make_completion,
)
from arl.intercept.toolcalls import parse_tool_calls
from arl.intercept.tracker import MessageTracker

Generate = Callable[[Sequence[int], SamplingParams], Awaitable[Generation]]


@attrs.frozen
class SamplingDefaults:
    """Sampling settings for the fields a request leaves unset."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


class ChatHandler:
    """``await handler(env_id, request) -> ChatCompletion`` for one episode (see the module doc)."""

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
        self.name = name  # the episode's name in errors and completion ids (default: the routed key)
        self.calls = 0  # model calls started (the index `seed_for` gets)
        self.closed = False
        self.fault: tuple[str, str, str] | None = None

    def close(self) -> None:
        """The episode ended: later calls are refused with `EpisodeClosed`."""
        self.closed = True

    async def _engine_generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        gen = await self.engine.generate(prompt_ids, params)
        return gen[0] if isinstance(gen, list) else gen

    async def __call__(self, env_id: str, request: ChatRequest) -> Any:
        env_id = self.name or env_id  # over HTTP the routed key is a secret bearer token: never echo it
        if self.closed or self.fault is not None:
            reason = self.fault[1] if self.fault else "finished"
            raise EpisodeClosed(f"episode {env_id!r} has ended ({reason})")
        d, tokenizer = self.defaults, self.tracker.tokenizer
        prompt = self.tracker.prepare(request.messages, request.tools, normalized=True)  # parse_request did
        max_tokens = request.max_tokens or d.max_tokens
        limit = self.max_model_len
        if limit is not None and len(prompt.prompt_ids) + max_tokens > limit:
            message = (f"prompt of {len(prompt.prompt_ids)} tokens + max_tokens {max_tokens} exceeds the "
                       f"model's context of {limit} tokens")
            self.fault = ("Finished", "max_length", message)
            raise ContextLengthExceeded(message)
        turn, self.calls = self.calls, self.calls + 1
        seed = self.seed_for(turn) if self.seed_for is not None else request.seed
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=d.temperature if request.temperature is None else request.temperature,
            top_p=d.top_p if request.top_p is None else request.top_p,
            top_k=d.top_k if request.top_k is None else request.top_k,
            seed=seed,
            stop_token_ids=tuple(self.tracker.end_of_turn_ids[-1:]) + self._stop_ids(request),
        )
        try:
            gen = await self._generate(prompt.prompt_ids, params)
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
        text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        calls: list[dict[str, Any]] = []
        content: str | None = text
        if request.tools and request.tool_choice != "none":
            content, calls = parse_tool_calls(text, id_prefix=f"call_{turn}")
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = calls
        self.tracker.commit(prompt, gen.token_ids, gen.logprobs, gen.finish_reason, reply, gen.policy_version)
        finish = "length" if gen.finish_reason == "length" else ("tool_calls" if calls else "stop")
        token_logprobs = None
        if request.logprobs:
            pieces = tokenizer.convert_ids_to_tokens(list(gen.token_ids))
            token_logprobs = list(zip(pieces, gen.logprobs, strict=True))
        return make_completion(
            completion_id=f"chatcmpl-{env_id}-{turn}", model=request.model, content=content, tool_calls=calls,
            finish_reason=finish, prompt_tokens=len(prompt.prompt_ids), completion_tokens=len(gen.token_ids),
            token_logprobs=token_logprobs,
        )

    def _stop_ids(self, request: ChatRequest) -> tuple[int, ...]:
        """``stop`` strings that are single tokens become stop tokens; others are refused (a
        string stop would cut the engine's tokens mid-token and break token-exactness)."""
        ids = []
        for text in request.stop:
            encoded = self.tracker.tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) != 1:
                raise BadRequest(f"stop string {text[:40]!r} is not a single token; only single-token "
                                 "stops are supported", param="stop")
            ids.append(int(encoded[0]))
        return tuple(ids)


__all__ = ["ChatHandler", "Generate", "SamplingDefaults"]
