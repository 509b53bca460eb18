"""Sandbox backends: one interface, chosen by name or config (``rollout.sandbox.backend``).

    sandbox = open_sandbox(SandboxLimits(wall_s=5), backend="auto", python=True)
    await sandbox.start()
    result = await sandbox.exec(["python", "-c", "print(1)"], timeout=5, workdir="/workspace", env={"A": "1"})
    await sandbox.stop()

Every backend gives the same `Sandbox` surface: ``start`` / ``exec(argv, timeout, workdir, env)``
/ ``stop`` (and the older ``run(command)``, ``spawn``, ``write_file``, ``close``), the same
`CommandResult` statuses and the same error policy: what a command does (a timeout, a crash, a
missing program, output past the cap) is a result, a sandbox that is gone raises `SandboxDied`,
a backend that cannot start here raises `SandboxUnavailable` with the reason. ``stop`` finishes
even when its caller is cancelled. What each backend isolates: docs/threat_model.md.

`BACKENDS`:

- ``"bwrap"``: bubblewrap (`arl.sandbox.bwrap`), each command a sandbox of its own;
- ``"podman"`` / ``"docker"``: one container per sandbox from arl's own local image, never pulled
  (`arl.sandbox.oci`);
- ``"none"``: the host, loud: its `Sandbox.isolation_warning` lists what is not isolated, logged
  once per process;
- ``"auto"``: the first of bwrap, podman, docker that can start here, else "none" (warned). bwrap
  comes first although a container also hides the host's files: the adversarial suites
  (tests/envs/test_adversarial_*.py) have been run against it, and it costs a fraction of a
  container per command; a container runtime is the fallback where bubblewrap cannot start
  (no user namespaces, e.g. inside an unprivileged container).

`default_backend` is what callers that name none get: ``"auto"`` unless `set_default_backend`
(called by `arl.rollout.factory.make_manager` from the config) said otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from arl.sandbox.bwrap import bwrap_problem
from arl.sandbox.rlimits import SandboxLimits
from arl.sandbox.sandbox import IsolationWarning, Sandbox, SandboxUnavailable

BACKENDS = ("auto", "bwrap", "podman", "docker", "none")
_AUTO_ORDER = ("bwrap", "podman", "docker")
_default = "auto"
_log = logging.getLogger(__name__)


def set_default_backend(backend: str) -> None:
    """The backend of every sandbox opened with ``backend=None`` in this process from now on."""
    global _default
    if backend not in BACKENDS:
        raise ValueError(f"sandbox backend must be one of {BACKENDS}, got {backend!r}")
    _default = backend


def default_backend() -> str:
    return _default


def backend_problem(backend: str) -> str | None:
    """Why ``backend`` cannot run sandboxes here, or None ("none" always can; "auto" when one can)."""
    if backend not in BACKENDS:
        return f"unknown sandbox backend {backend!r} (one of {BACKENDS})"
    if backend == "bwrap":
        return bwrap_problem()
    if backend in ("podman", "docker"):
        from arl.sandbox.oci import oci_problem

        return oci_problem(backend)
    return None


def available_backends() -> tuple[str, ...]:
    """The backends that can run here, strongest first (the order "auto" tries), "none" last."""
    return (*(b for b in _AUTO_ORDER if backend_problem(b) is None), "none")


def choose_backend(backend: str | None = None) -> str:
    """The backend ``backend`` (None: `default_backend`) resolves to here. Raises
    `SandboxUnavailable` when a named one cannot start."""
    backend = backend or _default
    if backend not in BACKENDS:
        raise ValueError(f"sandbox backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if bwrap_problem() is None:
            return "bwrap"
        return next((b for b in _AUTO_ORDER[1:] if backend_problem(b) is None), "none")
    problem = backend_problem(backend)
    if problem is not None:
        raise SandboxUnavailable(f"sandbox backend {backend!r} cannot start here: {problem}")
    return backend


def open_sandbox(
    limits: SandboxLimits = SandboxLimits(),  # noqa: B008 (frozen: one shared default is safe)
    *,
    backend: str | None = None,
    read_only: Sequence[str | Path] = (),
    python: bool = False,
    hide: Sequence[str | Path] = (),
    env: Mapping[str, str] | None = None,
    **oci: Any,
) -> Sandbox:
    """A sandbox of ``backend`` (None: `default_backend`; see the module docstring). ``oci``:
    `arl.sandbox.oci.OciSandbox`'s own keywords (``cpus``, ``image``), for a container backend."""
    chosen = choose_backend(backend)
    if chosen in ("podman", "docker"):
        from arl.sandbox.oci import OciSandbox

        return OciSandbox(limits, runtime=chosen, read_only=read_only, python=python, hide=hide, env=env, **oci)
    # "auto" that found bwrap unusable and no container runtime keeps Sandbox's own fallback warning
    isolation = "auto" if (backend or _default) == "auto" and chosen == "none" else chosen
    sandbox = Sandbox(limits, isolation=isolation, read_only=read_only, python=python, hide=hide, env=env)
    if sandbox.isolation == "none" and (warning := sandbox.isolation_warning) is not None:
        _warn_once(warning)
    return sandbox


_warned: set[tuple[str, tuple[str, ...]]] = set()


def _warn_once(warning: IsolationWarning) -> None:
    """Log ``warning`` once per process per backend and list of losses (not per uid in its text)."""
    if (warning.backend, warning.lost) not in _warned:
        _warned.add((warning.backend, warning.lost))
        _log.warning("%s (arl.sandbox.backends; docs/threat_model.md)", warning.message)


__all__ = ["BACKENDS", "available_backends", "backend_problem", "choose_backend", "default_backend",
           "open_sandbox", "set_default_backend"]
