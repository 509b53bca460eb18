"""Deprecated: the sandbox is `arl.sandbox` (moved out of envs on 2026-12-04: the bug-fix env, its
tools and pull mode all use it). ``from arl.envs.sandbox import Sandbox`` keeps working for one
release with a DeprecationWarning naming the new place (docs/architecture.md §10); this module
imports nothing of the sandbox until one of its old names is used.
"""

from arl._renamed import old_names

# the old module's __all__, every name of which arl.sandbox exports
__getattr__ = old_names(__name__, globals(), **{name: f"arl.sandbox:{name}" for name in (
    "COMMAND_STATUSES", "ISOLATIONS", "SANDBOX_CWD", "CommandResult", "Sandbox",
    "SandboxLimits", "SandboxUnavailable", "bwrap_problem", "limits_prefix", "python_paths",
)})
