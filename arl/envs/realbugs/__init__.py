"""Bugs in real code: ``arl/RealBugFix-v0`` (`arl.envs.realbugs.env.RealBugFixEnv`).

Pinned PyPI sdists (`arl.envs.realbugs.packages`), one-token mutations their own tests catch
(`arl.envs.realbugs.tasks`), verified and cached by `arl.envs.realbugs.build`, judged by the
package's test suite in a sandbox (`arl.envs.realbugs.suite`). Build once:
``python -m arl.envs.realbugs.build``.
"""

from arl.envs.realbugs.env import PackageTestsSpec, RealBugFixEnv, task_for
from arl.envs.realbugs.packages import PACKAGES, PackageUnavailable
from arl.envs.realbugs.solver import realbug_calls
from arl.envs.realbugs.tasks import TASKS, RealBug

__all__ = ["PACKAGES", "TASKS", "PackageTestsSpec", "PackageUnavailable", "RealBug", "RealBugFixEnv", "realbug_calls",
           "task_for"]
