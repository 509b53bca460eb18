"""The sandbox: one episode's commands without network, under whole-sandbox limits, as a uid of their own.

Not an env: the bug-fix env judges code in it, its tools run commands in it, and pull-mode agents
run in it. `sandbox` is the API (``Sandbox``, ``SandboxLimits``, ``CommandResult``, the isolation
table); `backends` chooses and opens one of several backends behind that API (``open_sandbox``:
bwrap, podman, docker, none; ``start`` / ``exec`` / ``stop``); the rest are its parts: `bwrap`
(bubblewrap command lines, uids and reaping), `oci` (the container backend: arl's local image,
containers, orphans), `cgroups` (whole-sandbox memory and processes), `rlimits` (per-process
limits), `seccomp` (the syscall filter), `hostfs` (bounded host-side file work), `capped_output`
(output under a cap) and `uid_delegation` (tool uids for a pull-mode agent). What it promises:
docs/threat_model.md.
"""

from __future__ import annotations

__all__ = ["BACKENDS", "COMMAND_STATUSES", "ISOLATIONS", "SANDBOX_CWD", "CommandResult", "IsolationWarning", "Sandbox",
           "SandboxDied", "SandboxLimits", "SandboxUnavailable", "bwrap_problem", "choose_backend", "limits_prefix",
           "open_sandbox", "python_paths"]
_FROM_BACKENDS = ("BACKENDS", "choose_backend", "open_sandbox")


def __getattr__(name: str) -> object:
    """The API lazily (``from arl.sandbox import Sandbox``): the games' tool wrapper imports only
    `hostfs`, and `import arl` must not load the sandbox's machinery for it."""
    if name in __all__:
        import importlib

        return getattr(importlib.import_module("arl.sandbox.backends" if name in _FROM_BACKENDS
                                               else "arl.sandbox.sandbox"), name)
    raise AttributeError(f"module 'arl.sandbox' has no attribute {name!r}")
