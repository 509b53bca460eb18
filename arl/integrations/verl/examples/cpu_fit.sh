#!/usr/bin/env bash
# verl 0.9.1's own training loop (python -m verl.trainer.main_ppo) on the CPU: arl's FrozenLake
# episodes, GiGPO (trainer mode arl_sync), the tiny model, FSDP2 actor + reference over gloo on
# 2 logical workers, arl's HF engine as the rollout replica (one replica over all workers: its
# server is fed by rank 0 after every step, checked by arl's canary). See arl/integrations/verl/cpu/ and docs/verl.md.
#   bash arl/integrations/verl/examples/cpu_fit.sh                   # 3 steps, checkpoint at the end
#   STEPS=4 bash arl/integrations/verl/examples/cpu_fit.sh           # same OUT: resumes from the checkpoint
# Env: OUT (run dir: data, checkpoints; default /tmp/arl-verl-cpu-fit), STEPS (total steps, 3),
# SAVE_FREQ (2), MODEL (tiny), WORKERS (logical GPUs = FSDP ranks, 2), DATA_SEED (verl's data.seed: the
# shuffled order of the rows, 0; verl's default null draws a new order per launch), WARM_START (1: start from
# arl's format warm-start of MODEL, written once to $OUT/warm_start by arl.integrations.verl.warm_start on the
# agent loop's own prompts; 0, the default: MODEL as is), AGENT_LOOP (the entry of agent_loops_cpu.yaml that
# the dataset's rows name: arl_agent, a traj row per episode, the default; arl_agent_step, a row per turn; an
# OUT's data is written once, so one OUT per agent loop), MINI (verl's
# ppo_mini_batch_size in dataset rows: each optimizer step takes MINI x GROUP verl rows; default and most
# GROUPS_PER_STEP (verl's validate_config): one optimizer step per training step where a row is an episode,
# one per MINI x GROUP rows where a row is a turn), MICRO (rows per forward
# pass on each worker, for the update and the log-prob passes: 2), TRAIN_GROUPS (the training dataset's rows,
# levels 0..TRAIN_GROUPS-1: 64; with data.shuffle=false and TRAIN_GROUPS = STEPS x GROUPS_PER_STEP, step k
# plays levels (k-1) x GROUPS_PER_STEP onward, as arl's trainer at seed 0 does), more hydra overrides as args.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-/tmp/arl-verl-cpu-fit}
STEPS=${STEPS:-3}
SAVE_FREQ=${SAVE_FREQ:-2}
WORKERS=${WORKERS:-2}
MODEL=${MODEL:-$("$PYTHON" -c 'from arl.models import resolve_model; print(resolve_model("tiny"))')}
GROUPS_PER_STEP=${GROUPS_PER_STEP:-2}   # verl rows per step
GROUP=${GROUP:-2}                       # rollout.n: episodes per row (the GiGPO group)
DATA_SEED=${DATA_SEED:-0}
MINI=${MINI:-$GROUPS_PER_STEP}
MICRO=${MICRO:-2}
AGENT_LOOPS=arl/integrations/verl/examples/agent_loops_cpu.yaml
AGENT_LOOP=${AGENT_LOOP:-arl_agent}

mkdir -p "$OUT/data"
if [ "${WARM_START:-0}" = 1 ]; then
  [ -f "$OUT/warm_start/config.json" ] || "$PYTHON" -m arl.integrations.verl.warm_start --agent-loops "$AGENT_LOOPS" \
    --name "$AGENT_LOOP" --env arl/FrozenLake-v0 --model "$MODEL" --out "$OUT/warm_start"
  MODEL="$OUT/warm_start"
fi
[ -f "$OUT/data/train.parquet" ] || "$PYTHON" -m arl.integrations.verl.dataset --env arl/FrozenLake-v0 \
  --groups "${TRAIN_GROUPS:-64}" --max-tokens 24 --agent-name "$AGENT_LOOP" --out "$OUT/data/train.parquet"
[ -f "$OUT/data/val.parquet" ] || "$PYTHON" -m arl.integrations.verl.dataset --env arl/FrozenLake-v0 \
  --groups 2 --base-seed 1000000007 --tag val --max-tokens 24 --agent-name "$AGENT_LOOP" --out "$OUT/data/val.parquet"

# verl imports arl's CPU platform in every process (verl/__init__.py: VERL_USE_EXTERNAL_MODULES);
# VERL_PLATFORM=cpu selects it. Ray gets WORKERS logical GPUs (verl's placement groups ask for them).
export VERL_USE_EXTERNAL_MODULES=arl.integrations.verl.cpu VERL_PLATFORM=cpu
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
FP32='{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
exec "$PYTHON" -m verl.trainer.main_ppo \
  hydra.run.dir="$OUT/hydra" \
  +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=arl.integrations.verl.setup_verl \
  +ray_kwargs.ray_init.num_cpus=16 +ray_kwargs.ray_init.num_gpus="$WORKERS" \
  +ray_kwargs.ray_init.include_dashboard=false \
  trainer.use_v1=true trainer.v1.trainer_mode=arl_sync \
  algorithm.adv_estimator=arl_gigpo algorithm.use_kl_in_reward=false \
  algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=2.0 \
  data.train_files="$OUT/data/train.parquet" data.val_files="$OUT/data/val.parquet" \
  data.train_batch_size="$GROUPS_PER_STEP" data.return_raw_chat=true data.dataloader_num_workers=0 \
  data.seed="$DATA_SEED" \
  data.max_prompt_length=512 data.max_response_length=512 \
  actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.model.use_remove_padding=false \
  actor_rollout_ref.model.enable_gradient_checkpointing=false \
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.actor.use_torch_compile=false \
  +actor_rollout_ref.actor.fsdp_config.mixed_precision="$FP32" \
  +actor_rollout_ref.ref.fsdp_config.mixed_precision="$FP32" \
  actor_rollout_ref.rollout.name=arl_hf actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.tensor_model_parallel_size="$WORKERS" \
  actor_rollout_ref.rollout.n="$GROUP" actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.agent.num_workers=1 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$AGENT_LOOPS" \
  actor_rollout_ref.rollout.agent.default_agent_loop="$AGENT_LOOP" \
  actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.ppo_mini_batch_size="$MINI" \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO" \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$MICRO" \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$MICRO" \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.01 \
  actor_rollout_ref.actor.entropy_coeff=0.001 \
  reward.num_workers=1 transfer_queue.backend.SimpleStorage.num_data_storage_units=1 \
  trainer.device=cpu trainer.n_gpus_per_node="$WORKERS" trainer.nnodes=1 \
  trainer.project_name=arl trainer.experiment_name=frozenlake_cpu_fit \
  trainer.default_local_dir="$OUT/checkpoints" trainer.resume_mode=auto \
  trainer.total_training_steps="$STEPS" trainer.save_freq="$SAVE_FREQ" \
  trainer.val_before_train=false trainer.test_freq=-1 trainer.logger='[console]' "$@"
