"""The shared building block of every advantage estimator: input handling and `group_normalize`.

Private: both `advantages` (REINFORCE, GRPO) and `step_level` (GiGPO) build on these, and
`advantages` re-exports the step-level estimators, so the shared part has to sit below both of
them for the imports to stay one-directional (advantages imports step_level; both import this
module, which imports neither). Import its public names (`group_normalize`, `CONSTANT_STD`)
from `arl.algo.advantages`.

`group_normalize` is where the conventions listed in `advantages` (unbiased std, singleton and
constant groups give 0) are enforced; every estimator's group statistics go through it.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

# A group whose unbiased std is at or below this is "constant": advantage 0. Fixed (not `eps`):
# `eps` only guards the division, it should not decide which groups carry signal.
CONSTANT_STD = 1e-6

# Inputs: sequences, numpy arrays, or CPU torch tensors (anything with .detach()).
Floats = Sequence[float] | np.ndarray | Any
Keys = Sequence[Hashable] | np.ndarray | Any
Sized = Any  # anything with len()


# ----------------------------------------------------------------------------------------------
# input handling


def _floats(name: str, values: Floats) -> np.ndarray:
    """A 1-D float64 array; torch tensors are detached and moved to the CPU first."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one value per sample (1-D), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        # One NaN would poison its whole group's mean: refuse rather than spread it.
        raise ValueError(f"{name} has non-finite values at rows {np.flatnonzero(~np.isfinite(arr)).tolist()}")
    return arr


def _keys(values: Keys) -> list[Hashable]:
    """Group / trajectory / state keys as a list of hashables (tensor entries become ints)."""
    if hasattr(values, "tolist"):
        return list(values.tolist())
    return list(values)


def _renamed_keywords(**renames: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate an estimator so that each old keyword ``old=new`` still works, with a
    DeprecationWarning naming the new one (``gigpo(state_hashes=...)``: ``state_keys``). Given with
    its new name too: TypeError. (`arl._renamed.renamed_keywords`, which algo may not import.)"""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    warnings.warn(f"{fn.__name__}({old}=...) is deprecated: use {fn.__name__}({new}=...)",
                                  DeprecationWarning, stacklevel=2)
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}() got {old} and {new}: {old} is the old name of {new}; "
                                        f"give only {new}")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper

    return decorate


def _check_lengths(**fields: Sized) -> int:
    lengths = {name: len(v) for name, v in fields.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"fields must have one entry per sample; got lengths {lengths}")
    return next(iter(lengths.values()))


def _group_rows(keys: Sequence[Hashable]) -> list[np.ndarray]:
    """Row indices of each distinct key, in first-seen order."""
    groups: dict[Hashable, list[int]] = {}
    for row, key in enumerate(keys):
        groups.setdefault(key, []).append(row)
    return [np.asarray(rows, dtype=np.int64) for rows in groups.values()]


# ----------------------------------------------------------------------------------------------
# the shared building block


def group_normalize(
    values: np.ndarray, groups: Sequence[np.ndarray], *, std_normalize: bool, eps: float
) -> np.ndarray:
    """Normalise `values` inside each group of row indices.

        x_i <- (x_i - mean_g) / (std_g + eps)    (std_normalize, std unbiased)
        x_i <- x_i - mean_g                      (otherwise)

    Singleton groups and constant groups (std_g <= 1e-6) give exactly 0.

    >>> groups = [np.array([0, 1, 2]), np.array([3])]
    >>> group_normalize(np.array([1.0, 0.0, 0.0, 5.0]), groups, std_normalize=False, eps=1e-6).round(4)
    array([ 0.6667, -0.3333, -0.3333,  0.    ])
    """
    out = np.zeros_like(values, dtype=np.float64)
    for rows in groups:
        if len(rows) < 2:
            continue  # nothing to compare against
        group = values[rows]
        std = group.std(ddof=1)
        if std <= CONSTANT_STD:
            continue  # every member scored the same: no signal, and (x - mean) is only noise
        centred = group - group.mean()
        out[rows] = centred / (std + eps) if std_normalize else centred
    return out
