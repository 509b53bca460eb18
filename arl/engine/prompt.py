"""PromptView: a prompt held as a prefix of an append-only token list, without a copy.

A multi-turn prompt is every token of the conversation so far, so a record per model call that
kept its own list would make an episode's memory quadratic in its length. The trajectory manager
(one token list per episode) and the MessageTracker (one per branch) append to one list and hand
out views of its prefixes. It lives beside the engine contract because it is the prompt type both
sides of the engine share: `intercept` and `rollout` import `engine`, never each other's records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class PromptView(Sequence[int]):
    """The first `length` ids of an episode's append-only token list, held without a copy.

    A trajectory-mode prompt is every token of the episode so far, so a Turn that kept its own
    list would make an episode's memory quadratic in its length (50 turns of ~3.4k-token prompts:
    ~1.3 MiB of pointers per episode; benchmarks/HISTORY.md "Scaling"). The manager appends to one
    list and each Turn keeps a view of the prefix it was prompted with; appends after the view
    was taken are not part of it. Reads like a list: len, indexing, slices (lists), iteration,
    `==` with any int sequence, `+` (a new list), numpy conversion.
    """

    __slots__ = ("_ids", "_length")

    def __init__(self, ids: list[int], length: int | None = None) -> None:
        if length is None:
            length = len(ids)
        if not 0 <= length <= len(ids):
            raise ValueError(f"PromptView of {length} ids over a list of {len(ids)}")
        self._ids, self._length = ids, length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            if index.step is not None and index.step < 0:  # rare: copy the prefix, then slice it
                return self.tolist()[index]
            return self._ids[slice(*index.indices(self._length))]
        if not -self._length <= index < self._length:
            raise IndexError("PromptView index out of range")
        return self._ids[index % self._length]

    def __iter__(self) -> Any:
        return iter(self._ids[: self._length])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, PromptView)):
            return len(other) == self._length and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a view of a mutable list, like a list

    def __add__(self, other: Sequence[int]) -> list[int]:
        return self.tolist() + list(other)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        import numpy as np

        return np.asarray(self.tolist(), dtype=dtype)

    def tolist(self) -> list[int]:
        return self._ids[: self._length]

    def __repr__(self) -> str:
        return f"PromptView({self.tolist()!r})"


__all__ = ["PromptView"]
