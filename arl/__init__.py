"""arl: a single-process asyncio framework for training LLM agents with reinforcement learning.

`import arl` stays light: it registers the gymnasium environments and nothing imports torch or
vLLM until a model or engine is used.
"""

__version__ = "0.1.0"
