"""Checking token ids against an `OutputConstraint` with xgrammar, the grammar engine vLLM's
structured outputs use (so a check here and a mask there agree on what a constraint allows).

vLLM enforces a constraint while it samples; engines that answer from a script (`ScriptedEngine`)
cannot mask anything, so they check their reply afterwards with `first_violation` and fail loudly
instead of handing an agent a reply its request forbade. xgrammar is imported lazily: it comes with
vLLM, and an install without vLLM has no constrained decoding to check.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any

from arl.engine.base import EngineUnsupportedError, OutputConstraint


def available() -> bool:
    """Whether xgrammar can be imported here (it ships with vLLM)."""
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=8)
def _compiler(tokenizer: Any, vocab_size: int, stop_ids: tuple[int, ...]) -> Any:
    # TokenizerInfo scans the whole vocabulary (~0.1-1 s): once per tokenizer, not per request
    try:
        import xgrammar as xgr
    except ImportError as exc:
        raise EngineUnsupportedError("checking an output constraint needs xgrammar (installed with vLLM)") from exc
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids))
    return xgr.GrammarCompiler(info, max_threads=2, cache_limit_bytes=64 * 2**20)  # bounded: agents send many schemas


def compile_constraint(tokenizer: Any, vocab_size: int, constraint: OutputConstraint,
                       stop_ids: Iterable[int]) -> Any:
    """The xgrammar CompiledGrammar of ``constraint`` for this tokenizer (``stop_ids``: the tokens that
    may end a reply once the constraint is met)."""
    compiler = _compiler(tokenizer, int(vocab_size), tuple(sorted(int(i) for i in stop_ids)))
    if constraint.kind == "json_object":
        return compiler.compile_builtin_json_grammar()
    if constraint.kind == "json_schema":
        return compiler.compile_json_schema(json.dumps(constraint.spec))
    return compiler.compile_structural_tag(json.dumps(constraint.spec))


def first_violation(tokenizer: Any, vocab_size: int, constraint: OutputConstraint, token_ids: Sequence[int],
                    stop_ids: Iterable[int]) -> int | None:
    """The index of the first token of ``token_ids`` the constraint forbids, or None when every token
    is allowed (a reply cut short by max_tokens, still inside the grammar, is allowed: the engine
    would have sampled the same prefix). A stop token is allowed only where the constraint is met.

    >>> from transformers import AutoTokenizer
    >>> from arl.models import resolve_model
    >>> tok = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    >>> eos = tok.eos_token_id
    >>> ids = tok.encode('{"a": 1}', add_special_tokens=False)
    >>> first_violation(tok, len(tok), OutputConstraint("json_object"), ids + [eos], [eos]) is None
    True
    >>> bad = tok.encode('Hello {"a": 1}', add_special_tokens=False)
    >>> first_violation(tok, len(tok), OutputConstraint("json_object"), bad, [eos])
    0
    >>> first_violation(tok, len(tok), OutputConstraint("json_object"), ids[:-1] + [eos], [eos]) == len(ids) - 1
    True
    """
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compile_constraint(tokenizer, vocab_size, constraint, stop_ids))
    for k, token in enumerate(token_ids):
        if not matcher.accept_token(int(token)):
            return k
    return None


__all__ = ["available", "compile_constraint", "first_violation"]
