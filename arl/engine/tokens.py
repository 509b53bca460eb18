"""TokenRow: one training sequence's tokens, loss mask and engine log-probs, built segment by segment.

Every sequence arl trains on is, in order, context the model read (a prompt, the bridge tokens a
chat template puts between turns, a closing end-of-turn the engine did not sample: mask 0,
log-prob 0.0) and replies the engine sampled (mask 1, the engine's own log-probs). The traj, step
and fork managers and the chat tracker build their rows here, so the idiom and its alignment
check live in one place; `arl.rollout.records.Sample` and the tracker's samples take the three
lists as they are.

Each generated segment may say how it was drawn (`arl.engine.base.SampledWith`): ``sampled_with``
holds one record per generated segment, in order, or is empty when any segment did not say (the
trainer then scores the row at its configured temperature). It may also say which policy version
sampled it (``version``, the engine's ``policy_version`` of its request): ``token_versions`` holds
one per token, -1 on context tokens, or is empty when any generated segment did not say. A partial
rollout's carried episode mixes versions in one row (`arl.rollout.partial`).

>>> row = TokenRow().context([5, 6]).generated([7, 8], [-0.5, -0.25]).context([2])
>>> row.ids, row.mask, row.logprobs
([5, 6, 7, 8, 2], [0, 0, 1, 1, 0], [0.0, 0.0, -0.5, -0.25, 0.0])
>>> row.cut(4).mask
[0, 0, 1, 1]
>>> hot = SampledWith(temperature=0.3)
>>> row = TokenRow().context([5]).generated([7], [-0.1], hot).context([2]).generated([9], [-0.2], hot)
>>> len(row.sampled_with), len(row.cut(3).sampled_with)
(2, 1)
>>> row = TokenRow().context([5]).generated([7, 8], [-0.1, -0.2], version=3).context([2]).generated([9], [-0.3], version=4)
>>> row.token_versions, row.cut(3).token_versions
([-1, 3, 3, -1, 4], [-1, 3, 3])
>>> TokenRow().generated([7], [-0.1]).token_versions  # a segment that did not say: not recorded
[]
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from arl.engine.base import SampledWith


@attrs.define
class TokenRow:
    """``ids``, ``mask`` (1 on engine-sampled tokens) and ``logprobs`` (the engine's there, else 0.0), aligned."""

    ids: list[int] = attrs.Factory(list)
    mask: list[int] = attrs.Factory(list)
    logprobs: list[float] = attrs.Factory(list)
    # one entry per generated segment (None: that segment did not say how it was drawn)
    draws: list[SampledWith | None] = attrs.Factory(list)
    # one per token: the policy version that sampled it; -1 on context tokens and where a segment did not say
    versions: list[int] = attrs.Factory(list)

    def add(self, ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float],
            sampled_with: SampledWith | None = None, version: int | None = None) -> TokenRow:
        """Append a segment given in full (e.g. a tracked message's own row); returns self. A
        segment with sampled tokens in it holds one reply: ``sampled_with`` says how it was drawn,
        ``version`` which policy version sampled it."""
        if not len(ids) == len(mask) == len(logprobs):
            raise ValueError(f"segment misaligned: {len(ids)} tokens, {len(mask)} mask, {len(logprobs)} log-probs")
        runs = count_runs(mask)
        if runs and self.mask and self.mask[-1] and mask[0]:
            # two replies with no context between read as one run of sampled tokens: one draw record,
            # unknown (None) unless both were drawn alike
            runs -= 1
            if self.draws[-1] != sampled_with:
                self.draws[-1] = None
        self.draws += [sampled_with] * runs
        sampled = -1 if version is None else int(version)
        self.versions += [sampled if m else -1 for m in mask]
        self.ids += ids
        self.mask += mask
        self.logprobs += [float(x) for x in logprobs]
        return self

    def context(self, ids: Sequence[int]) -> TokenRow:
        """Tokens the model read but did not sample: never in the loss."""
        return self.add(ids, [0] * len(ids), [0.0] * len(ids))

    def generated(self, ids: Sequence[int], logprobs: Sequence[float],
                  sampled_with: SampledWith | None = None, version: int | None = None) -> TokenRow:
        """Tokens the engine sampled, with its log-probs (and how it drew them, which policy version
        did): what the loss trains."""
        return self.add(ids, [1] * len(ids), logprobs, sampled_with, version)

    def cut(self, n: int) -> TokenRow:
        """A new row of the first ``n`` tokens."""
        return TokenRow(self.ids[:n], self.mask[:n], self.logprobs[:n], self.draws[: count_runs(self.mask[:n])],
                        self.versions[:n])

    @property
    def token_versions(self) -> list[int]:
        """The policy version that sampled each token (-1 on context tokens); empty when any
        generated segment did not say (or the row was built without them)."""
        if len(self.versions) != len(self.ids) or any(v < 0 for v, m in zip(self.versions, self.mask, strict=True) if m):
            return []
        return list(self.versions)

    @property
    def sampled_with(self) -> tuple[SampledWith, ...]:
        """How each generated segment was drawn, in order; empty when any segment did not say."""
        return () if any(d is None for d in self.draws) else tuple(self.draws)  # type: ignore[arg-type]

    @classmethod
    def whole(cls, ids: list[int], mask: list[int], logprobs: list[float],
              sampled_with: Sequence[SampledWith] = (), token_versions: Sequence[int] = ()) -> TokenRow:
        """A finished row given as its three lists (not copied), e.g. a chat tracker's sample, how
        its replies were drawn as `sampled_with` reads it back (one per reply, or empty) and the
        version of each token as `token_versions` does (one per token, or empty)."""
        return cls(ids, mask, logprobs, list(sampled_with) or [None] * count_runs(mask),
                   list(token_versions) or [-1] * len(ids))

    @classmethod
    def turn(cls, prompt: Sequence[int], response: Sequence[int], logprobs: Sequence[float],
             closing: Sequence[int] = (), sampled_with: SampledWith | None = None,
             version: int | None = None) -> TokenRow:
        """One model call as a row: its prompt, the sampled response (by policy ``version``), the closing tokens."""
        return cls().context(prompt).generated(response, logprobs, sampled_with, version).context(closing)


def count_runs(mask: Sequence[int]) -> int:
    """The number of maximal runs of set mask bits: one per reply in a well-formed row.

    >>> count_runs([0, 1, 1, 0, 1]), count_runs([])
    (2, 0)
    """
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
