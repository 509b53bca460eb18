"""arl's games, agents and GiGPO inside verl's agent loop (optional extra: ``pip install 'arl[verl]'``).

- `agent_loop.ArlAgentLoop` ("arl_agent"): one arl episode per verl row, verl's `AgentLoopOutput`
  with the turns in ``extra_fields`` (traj manager or any `AgentRunner` through the proxy).
- `engine.ServerEngine`: arl's engine contract over verl's ``server_manager.generate``.
- `gigpo`: GiGPO per turn span and arl's GRPO on verl batches; `trainer`: the ``arl_sync`` v1
  trainer mode that runs ``algorithm.adv_estimator=arl_gigpo``.
- `dataset`: one parquet row per env seed and group.
- `cpu`: verl 0.9.1 on the CPU (a platform, three version-guarded patches, arl's HF engine as the
  ``arl_hf`` rollout replica), so ``verl.trainer.main_ppo`` runs without a GPU (``examples/cpu_fit.sh``).
- ``examples/``: the agent-loop YAML and a launch script (Sokoban GiGPO, Qwen2.5-0.5B-Instruct).

Submodules import verl on first use; `setup_verl` is the Ray ``worker_process_setup_hook`` that
registers arl's estimators and trainer mode in every verl process.
"""

from __future__ import annotations


def setup_verl() -> None:
    """Register ``arl_grpo`` / ``arl_gigpo`` and ``trainer.v1.trainer_mode=arl_sync`` with verl.

    verl's registries are per process and its trainer runs in a Ray actor, so registration must
    happen there: pass ``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=
    arl.integrations.verl.setup_verl`` (the example launch script does).
    """
    import arl  # noqa: F401 -- registers arl's gymnasium envs in this process
    from arl.integrations.verl.trainer import register

    register()
