"""The sandbox backends as pytest parameters, each skipped, saying why, where it cannot start here
(`arl.sandbox.backends.backend_problem`): the suites that run against bwrap run against every
container runtime this machine has (issue 48)."""

from __future__ import annotations

import pytest

from arl.sandbox.backends import backend_problem
from arl.sandbox.oci import RUNTIMES


def backend_param(backend: str) -> object:
    """``backend`` as a parameter, skipped with `backend_problem`'s reason where it cannot start."""
    problem = backend_problem(backend)
    return pytest.param(backend, marks=pytest.mark.skipif(problem is not None,
                                                          reason=f"{backend} unavailable here: {problem}"))


CONTAINERS = [backend_param(runtime) for runtime in RUNTIMES]  # podman, docker
