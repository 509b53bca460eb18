"""Stop strings: where a reply ends when the request names strings, not tokens.

A stop string can span several tokens and a token can hold several characters, so the match is
on the decoded text: the reply ends with the token that *completes* the first match (kept, with
its log-prob; the tokens after it are not part of the generation), finish reason "stop". vLLM
matches as tokens arrive and stops there (it detokenizes such requests only); backends that
cannot stop on text (HF, scripted) generate on and `BaseEngine.generate` cuts their generations
the same way afterwards, so every backend returns the same tokens for the same draw.

>>> pieces = ["Thou", "ght", ": go", "\\nObs", "ervation", ": wall"]
>>> decode = lambda ids: "".join(pieces[i] for i in ids)
>>> stop_cut(list(range(6)), decode, ("Observation:",))
6
>>> stop_cut(list(range(6)), decode, ("ght: g", "zzz"))
3
>>> stop_cut(list(range(6)), decode, ("zzz",)) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def first_prefix(token_ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                 hit: Callable[[str], bool]) -> int:
    """The smallest k with ``hit(decode(token_ids[:k]))``, for a ``hit`` true on the whole text
    (binary search: O(log n) decodes; ``hit`` only grows with the text, up to decoding artefacts
    at a cut inside a character, which are harmless here: the boundary found is a token where it
    turns true)."""
    lo, hi = 1, len(token_ids)  # hit(decode(ids[:hi])) holds
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(decode(token_ids[:mid])):
            hi = mid
        else:
            lo = mid + 1
    return hi


def stop_cut(token_ids: Sequence[int], decode: Callable[[Sequence[int]], str], stops: Sequence[str]) -> int | None:
    """How many of ``token_ids`` a reply keeps when it ends at the first of ``stops`` (the token
    completing the match included), or None when no stop string occurs in the decoded text."""
    if not stops or not any(s in decode(token_ids) for s in stops):
        return None
    return first_prefix(token_ids, decode, lambda text: any(s in text for s in stops))


__all__ = ["first_prefix", "stop_cut"]
