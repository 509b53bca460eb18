"""Helpers for tests of image observations on the zoo's tiny-vl (its fixtures are in tests/conftest.py)."""

from __future__ import annotations

from arl.models.tiny_vl import IMAGE_PAD

# Patches per image token: 2 x 2 merged (tiny-vl's processor; the scripted engine's fake grid [1, 2, 2n] too).
MERGE_AREA = 4


def pad_id(tok) -> int:
    """The id of the image placeholder token, one per image token in an expanded prompt."""
    return tok.convert_tokens_to_ids(IMAGE_PAD)
