"""TokenRow: one training sequence's tokens, loss mask and engine log-probs, built segment by segment.

Every sequence arl trains on is, in order, context the model read (a prompt, the bridge tokens a
chat template puts between turns, a closing end-of-turn the engine did not sample: mask 0,
log-prob 0.0) and replies the engine sampled (mask 1, the engine's own log-probs). The traj, step
and fork managers and the chat tracker build their rows here, so the idiom and its alignment
check live in one place; `arl.rollout.records.Sample` and the tracker's samples take the three
lists as they are.

>>> row = TokenRow().context([5, 6]).generated([7, 8], [-0.5, -0.25]).context([2])
>>> row.ids, row.mask, row.logprobs
([5, 6, 7, 8, 2], [0, 0, 1, 1, 0], [0.0, 0.0, -0.5, -0.25, 0.0])
>>> row.cut(4).mask
[0, 0, 1, 1]
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.define
class TokenRow:
    """``ids``, ``mask`` (1 on engine-sampled tokens) and ``logprobs`` (the engine's there, else 0.0), aligned."""

    ids: list[int] = attrs.Factory(list)
    mask: list[int] = attrs.Factory(list)
    logprobs: list[float] = attrs.Factory(list)

    def add(self, ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float]) -> TokenRow:
        """Append a segment given in full (e.g. a tracked message's own row); returns self."""
        if not len(ids) == len(mask) == len(logprobs):
            raise ValueError(f"segment misaligned: {len(ids)} tokens, {len(mask)} mask, {len(logprobs)} log-probs")
        self.ids += ids
        self.mask += mask
        self.logprobs += [float(x) for x in logprobs]
        return self

    def context(self, ids: Sequence[int]) -> TokenRow:
        """Tokens the model read but did not sample: never in the loss."""
        return self.add(ids, [0] * len(ids), [0.0] * len(ids))

    def generated(self, ids: Sequence[int], logprobs: Sequence[float]) -> TokenRow:
        """Tokens the engine sampled, with its log-probs: what the loss trains."""
        return self.add(ids, [1] * len(ids), logprobs)

    def cut(self, n: int) -> TokenRow:
        """A new row of the first ``n`` tokens."""
        return TokenRow(self.ids[:n], self.mask[:n], self.logprobs[:n])

    @classmethod
    def turn(cls, prompt: Sequence[int], response: Sequence[int], logprobs: Sequence[float],
             closing: Sequence[int] = ()) -> TokenRow:
        """One model call as a row: its prompt, the sampled response, the closing tokens."""
        return cls().context(prompt).generated(response, logprobs).context(closing)
