"""Bug-fix tasks in a sandbox: generated tasks, the editor tool, the tool env, a scripted solver.

``arl/BugFix-v0`` (registered by `arl.envs.register_envs`): `BugFixEnv`, every seed a task of
`generate_task`, commands in an `arl.sandbox.sandbox.Sandbox`, reward = fraction of hidden tests
passing at submit or at the step limit (20 turns).
"""

from arl.envs.bugfix.env import TOOLS, BugFixEnv
from arl.envs.bugfix.judge import HiddenTestsSpec, JudgeUnavailable
from arl.envs.bugfix.solver import assistant_message, solution_calls, solution_text
from arl.envs.bugfix.tasks import BugFixTask, generate_task

__all__ = ["TOOLS", "BugFixEnv", "BugFixTask", "HiddenTestsSpec", "JudgeUnavailable", "assistant_message", "generate_task", "solution_calls", "solution_text"]
