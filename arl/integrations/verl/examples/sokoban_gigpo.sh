#!/usr/bin/env bash
# Sokoban GiGPO with Qwen2.5-0.5B-Instruct on 1 node x N GPUs, arl's games and GiGPO inside verl 0.9.1.
#   pip install -e '.[verl]' 'vllm==0.24.0'    # on the GPU node: verl[vllm]'s vLLM pin (docs/verl.md: not that
#                                              # extra itself, whose transformers==5.9.0 arl's floor excludes)
#   N_GPUS=8 bash arl/integrations/verl/examples/sokoban_gigpo.sh [more hydra overrides]
# Rollout: verl's vLLM servers; each agent-loop worker plays arl episodes (ArlAgentLoop, traj mode).
# Update: verl's FSDP actor; advantages: arl's GiGPO per turn span (trainer mode arl_sync).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
N_GPUS=${N_GPUS:-$(nvidia-smi -L | wc -l)}
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-data/arl_sokoban}
GROUP=${GROUP:-8}              # rollout.n: episodes per seed (the GiGPO group)
GROUPS_PER_STEP=${GROUPS_PER_STEP:-16}
MICRO_BATCH=${MICRO_BATCH:-4}  # sequences per GPU per forward/backward (verl's validate_config needs these
LOGPROB_MICRO_BATCH=${LOGPROB_MICRO_BATCH:-8}  # three set unless actor.use_dynamic_bsz=true)
TP=${TP:-1}  # vLLM tensor parallel: verl starts N_GPUS // TP replicas (its default TP 2 leaves none on 1 GPU)
if (( TP < 1 || N_GPUS < TP || N_GPUS % TP )); then
  echo "N_GPUS=$N_GPUS is not a multiple of TP=$TP: verl would start N_GPUS // TP = $(( TP > 0 ? N_GPUS / TP : 0 )) rollout replicas and leave the rest of the GPUs idle" >&2
  exit 2
fi
# GiGPO: verl-agent's conventions by default (arl.integrations.verl.gigpo.GIGPO_DEFAULTS: gamma 0.95,
# mean_norm, step-row episode statistics, raw singletons, invalid-action penalty 0.1); override any
# with +algorithm.arl_gigpo.<name>=..., e.g. arl's own: episode_stats=episodes singleton=zero invalid_penalty=0.

python -m arl.integrations.verl.dataset --env arl/Sokoban-v0 --groups 4096 --out "$DATA/train.parquet"
python -m arl.integrations.verl.dataset --env arl/Sokoban-v0 --groups 64 --base-seed 1000000007 --tag val \
  --out "$DATA/val.parquet"

python -m verl.trainer.main_ppo \
  +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=arl.integrations.verl.setup_verl \
  trainer.use_v1=true trainer.v1.trainer_mode=arl_sync \
  algorithm.adv_estimator=arl_gigpo algorithm.use_kl_in_reward=false \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/val.parquet" \
  data.train_batch_size="$GROUPS_PER_STEP" data.return_raw_chat=true \
  data.max_prompt_length=1024 data.max_response_length=4096 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n="$GROUP" actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.rollout.tensor_model_parallel_size="$TP" \
  actor_rollout_ref.rollout.agent.agent_loop_config_path=arl/integrations/verl/examples/agent_loops.yaml \
  actor_rollout_ref.rollout.agent.default_agent_loop=arl_agent \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size="$GROUPS_PER_STEP" \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO_BATCH" \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$LOGPROB_MICRO_BATCH" \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$LOGPROB_MICRO_BATCH" \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.01 \
  actor_rollout_ref.actor.entropy_coeff=0.001 \
  trainer.n_gpus_per_node="$N_GPUS" trainer.nnodes=1 \
  trainer.project_name=arl trainer.experiment_name=sokoban_gigpo_qwen05b \
  trainer.total_training_steps=${STEPS:-200} trainer.test_freq=10 trainer.save_freq=50 \
  trainer.logger='[console]' "$@"
