"""arl: a single-process asyncio framework for training LLM agents with reinforcement learning.

`import arl` stays light: it registers the gymnasium environments (`arl/Sokoban-v0`,
`arl/FrozenLake-v0`, ...) and imports neither torch nor vLLM until a model or engine is used.
The public names are resolved lazily (PEP 562) from the subpackages that define them:

    from arl import Trainer, load_config
    trainer = Trainer(load_config("tiny_frozenlake_gigpo", ["steps=10"]))  # a packaged config or a path
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

from arl.envs import register_envs

__version__ = "0.1.0"

# public name -> the module that defines it (imported on first access)
_LAZY: dict[str, str] = {
    "Trainer": "arl.train",
    "make_engine": "arl.engine",
    "EngineConfig": "arl.config",
    "SamplingParams": "arl.engine",
    "load_config": "arl.config",
    "TrainConfig": "arl.config",
    "ConfigError": "arl.config",
    "ManagerConfig": "arl.config",
    "GroupScheduler": "arl.rollout",
    "TrajEnvManager": "arl.rollout",
    "StepEnvManager": "arl.rollout",
    "ProxyEnvManager": "arl.rollout",
    "Sample": "arl.rollout",
    "collate": "arl.rollout",
    "make_manager": "arl.rollout.factory",
    "ProxyConfig": "arl.config",
    "InProcessClient": "arl.intercept",
    "ProxyServer": "arl.intercept",
    "MessageTracker": "arl.intercept",
    "AgentRunner": "arl.agents.runner",
    "EpisodeResult": "arl.agents.runner",
    "GymRunner": "arl.agents.gym_runner",
    "ToolCallRunner": "arl.agents.gym_runner",
    "PushModeRunner": "arl.agents.process",
    "PullModeRunner": "arl.agents.pull",
    "grpo": "arl.algo",
    "gigpo": "arl.algo",
}

__all__ = [  # a literal list, for linters and IDEs; tests/test_package.py checks it names every _LAZY key
    "__version__", "register_envs",
    "Trainer", "make_engine", "EngineConfig", "SamplingParams", "load_config", "TrainConfig", "ConfigError",
    "ManagerConfig", "GroupScheduler", "TrajEnvManager", "StepEnvManager", "ProxyEnvManager", "Sample", "collate",
    "make_manager", "ProxyConfig", "InProcessClient", "ProxyServer", "MessageTracker",
    "AgentRunner", "EpisodeResult", "GymRunner", "ToolCallRunner", "PushModeRunner", "PullModeRunner",
    "grpo", "gigpo",
]

if _TYPE_CHECKING:  # static analysers and IDEs see the real objects
    from arl.agents.gym_runner import GymRunner, ToolCallRunner
    from arl.agents.process import PushModeRunner
    from arl.agents.pull import PullModeRunner
    from arl.agents.runner import AgentRunner, EpisodeResult
    from arl.algo import gigpo, grpo
    from arl.config import ConfigError, EngineConfig, ManagerConfig, ProxyConfig, TrainConfig, load_config
    from arl.engine import SamplingParams, make_engine
    from arl.intercept import InProcessClient, MessageTracker, ProxyServer
    from arl.rollout import (
        GroupScheduler,
        ProxyEnvManager,
        Sample,
        StepEnvManager,
        TrajEnvManager,
        collate,
    )
    from arl.rollout.factory import make_manager
    from arl.train import Trainer


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


register_envs()
