"""arl: a single-process asyncio framework for training LLM agents with reinforcement learning.

`import arl` stays light: it registers the gymnasium environments (`arl/Sokoban-v0`,
`arl/FrozenLake-v0`, ...) and imports neither torch nor vLLM until a model or engine is used.
"""

from arl.envs import register_envs

__version__ = "0.1.0"

register_envs()
