"""TokenRow: the one builder of training rows (traj, step, fork managers and the chat tracker)."""

from __future__ import annotations

import doctest

import pytest

from arl.engine import tokens
from arl.engine.tokens import TokenRow


def test_doctests():
    failures, tried = doctest.testmod(tokens)
    assert tried >= 3 and failures == 0


def test_a_misaligned_segment_is_refused_and_the_row_left_as_it_was():
    row = TokenRow.turn([1, 2], [3], [-0.1], [9])
    with pytest.raises(ValueError, match="2 tokens, 2 mask, 1 log-probs"):
        row.generated([4, 5], [-0.2])
    assert (row.ids, row.mask, row.logprobs) == ([1, 2, 3, 9], [0, 0, 1, 0], [0.0, 0.0, -0.1, 0.0])
