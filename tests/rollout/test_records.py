"""PromptView: a Turn's prompt as a view of the episode's append-only token list."""

from __future__ import annotations

import numpy as np
import pytest

from arl.rollout import PromptView


def test_view_reads_like_the_list_it_was_taken_from():
    ids = [5, 6, 7]
    view = PromptView(ids)
    ids += [8, 9]  # appends after the view was taken are not part of it
    assert len(view) == 3 and list(view) == [5, 6, 7] and view.tolist() == [5, 6, 7]
    assert view == [5, 6, 7] and [5, 6, 7] == view and view == (5, 6, 7) and view != [5, 6, 7, 8]
    assert view[0] == 5 and view[-1] == 7 and view[1:] == [6, 7] and view[:10] == [5, 6, 7] and view[::-1] == [7, 6, 5]
    assert view + [1] == [5, 6, 7, 1] and isinstance(view + [1], list)
    assert np.asarray(view, dtype=np.int64).tolist() == [5, 6, 7]
    with pytest.raises(IndexError):
        view[3]
    with pytest.raises(IndexError):
        view[-4]
    assert PromptView(ids, 4) == [5, 6, 7, 8] and PromptView(ids, 0) == []


def test_view_length_must_fit_the_list():
    with pytest.raises(ValueError, match="over a list of 2"):
        PromptView([1, 2], 3)
    with pytest.raises(TypeError):
        hash(PromptView([1]))
