"""``rollout.name=arl_hf``: arl's HF engine as a verl rollout replica, trained weights synced into it.

verl 0.9.1 serves rollouts from vLLM/SGLang/TensorRT-LLM servers only, none of which runs in this
venv on a CPU. This module is arl's own engine (`arl.engine.hf.HFEngine`, the ``hf`` backend) behind
verl's rollout interfaces, registered in verl's two rollout registries (no verl file edited):

- `ArlHFReplica` (``RolloutReplicaRegistry["arl_hf"]``): what `LLMServerManager` launches per
  replica. In hybrid mode (the sync trainer: rollout colocated with the FSDP actor) it starts one
  `ArlHFServer` Ray actor next to the replica's trainer processes. verl's router gets the actor as
  the replica's server handle; `LLMServerClient.generate` calls its ``generate``.
- `ArlHFServer`: the engine in a Ray actor. ``generate(request_id, prompt_ids, sampling_params)``
  answers verl's token-in/token-out contract (`TokenOutput` with a log-prob per token and
  ``extra_fields["global_steps"]``, the weight version verl's v1 trainer tags samples with). It
  loads the model's weights from ``model.path`` at start (verl's default ``load_format=dummy`` is
  vLLM's; the first sync overwrites them anyway), in float32.
- `ArlHFServerAdapter` (``_ROLLOUT_REGISTRY[("arl_hf", "async")]``): the ``BaseRollout`` verl builds
  inside each actor process. verl's weight sync (``ActorRolloutRefWorker.update_weights``, backend
  ``naive``: after init and after every step) hands it the FSDP engine's full tensors; every rank
  iterates them (the DTensor gathers are collectives), rank 0 of each replica sends them to its server
  through Ray, then runs arl's weight-sync canary (`arl.train.canary.SyncCanary`): the server's greedy
  log-probs of a fixed probe against a teacher-forced forward, in this process, of a reference copy of
  the model holding exactly the pushed tensors. A gap over the fp32 tolerance raises
  `WeightSyncError` and stops the run. The gap and the served weight version are kept on the server
  (`ArlHFServer.sync_metrics`); the ``arl_sync`` trainer logs them with the step's metrics
  (``arl_sync/canary_max_abs``, ``arl_sync/weight_version``, ...).

What this does not prove on its own: that the tensors verl exported are the ones its FSDP forward
uses. verl's own check does, on every step's real samples: with ``rollout.calculate_log_probs`` its
old-log-prob step compares the rollout's log-probs with the actor's (``training/rollout_probs_diff_*``,
``training/rollout_actor_probs_pearson_corr``).

Not supported: LoRA weight sync (``peft_config``), delta weight sync, standalone/colocated
(non-hybrid) replicas, multimodal inputs.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

from arl.engine.base import Generation, SamplingParams

log = logging.getLogger(__name__)
log.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

ROLLOUT_NAME = "arl_hf"
SERVER_PREFIX = "arl_hf_server_"


def server_name(replica_rank: int, suffix: str = "") -> str:
    return f"{SERVER_PREFIX}{replica_rank}{suffix}"


def arl_sampling_params(sp: dict[str, Any], default_max_tokens: int) -> SamplingParams:
    """verl's request dict (vLLM's field names) as arl's SamplingParams."""
    top_k = int(sp.get("top_k", -1) or -1)
    return SamplingParams(
        max_tokens=int(sp.get("max_tokens") or sp.get("max_new_tokens") or default_max_tokens),
        temperature=float(sp.get("temperature", 1.0)),
        top_p=float(sp.get("top_p", 1.0)),
        top_k=max(top_k, 0),
        stop_token_ids=tuple(sp.get("stop_token_ids") or ()),
        seed=sp.get("seed"),
        ignore_eos=bool(sp.get("ignore_eos", False)),
    )


class ArlHFServer:
    """One replica's engine in a Ray actor (see the module docstring). Async methods: Ray runs them on
    the actor's event loop, where the engine batches concurrent requests."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int):
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        from arl.engine.hf import HFEngine

        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.max_model_len = int(config.max_model_len or (config.prompt_length + config.response_length))
        self.response_length = int(config.response_length)
        path = model_config.local_path or model_config.path
        torch.manual_seed(int(config.seed))
        self.engine = HFEngine(path, max_model_len=self.max_model_len, seed=int(config.seed), dtype="float32",
                               max_batch_size=min(int(config.max_num_seqs), 64), device="cpu")
        self.global_steps: int | None = None  # the weight version verl last synced (None: the initial load)
        self.syncs = 0
        self.last_sync: dict[str, float] = {}
        self.requests = 0

    def ready(self) -> str:
        return server_name(self.replica_rank)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> TokenOutput:
        if image_data is not None or video_data is not None:
            raise NotImplementedError("the arl_hf rollout serves text only")
        self.requests += 1
        params = arl_sampling_params(sampling_params, self.response_length)
        version = self.global_steps
        gen = await self.engine.generate(list(prompt_ids), params)
        stop = "aborted" if gen.finish_reason == "abort" else ("length" if gen.finish_reason == "length" else "completed")
        return TokenOutput(
            token_ids=list(gen.token_ids),
            log_probs=[float(x) for x in gen.logprobs] if sampling_params.get("logprobs", True) else None,
            stop_reason=stop,
            extra_fields={"global_steps": version if version is not None else 0,
                          "arl_engine_version": int(gen.policy_version)},
        )

    async def probe(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """The weight-sync canary's request (`arl.train.canary`): served like any other."""
        return await self.engine.generate(list(prompt_ids), params)

    async def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], global_steps: int | None) -> int:
        start = time.perf_counter()
        await self.engine.update_weights(named_tensors)
        if global_steps is not None:
            self.global_steps = int(global_steps)
        self.syncs += 1
        self.last_sync = {"arl_sync/load_s": time.perf_counter() - start, "arl_sync/tensors": float(len(named_tensors))}
        return int(self.engine.policy_version)

    async def record_sync(self, metrics: dict[str, float]) -> None:
        self.last_sync.update(metrics)

    async def sync_metrics(self) -> dict[str, float]:
        """The last sync's figures (canary gap, served version, load time); empty before any sync."""
        if not self.syncs:
            return {}
        return {**self.last_sync, "arl_sync/weight_version": float(self.global_steps or 0),
                "arl_sync/engine_version": float(self.engine.policy_version), "arl_sync/syncs": float(self.syncs),
                "arl_sync/requests": float(self.requests)}

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = int(global_steps)

    # verl's server lifecycle: the HF engine keeps its weights and has no KV cache between requests
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {"aborted_count": 0, "request_ids": []}  # the sync trainer never aborts (no partial rollout)

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class ArlHFReplica(RolloutReplica):
    """verl's rollout replica over one `ArlHFServer` (hybrid mode only)."""

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(f"the arl_hf rollout runs colocated with the trainer (hybrid mode), "
                                      f"not {self.rollout_mode}")
        node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
        name = server_name(self.replica_rank, self.name_suffix)
        server = ray.remote(ArlHFServer).options(
            name=name, num_cpus=0, max_concurrency=self.max_concurrency,
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"arl-hf://{name}"  # a key for verl's router; no HTTP server

    def sync_metrics(self) -> dict[str, float]:
        """The server's figures of the last weight sync (blocking; the trainer's loop is synchronous)."""
        return ray.get(self.servers[0].sync_metrics.remote())


class _RemoteEngine:
    """The canary's view of a server: ``generate`` and ``name``, as arl's engines have."""

    name = ROLLOUT_NAME

    def __init__(self, server: Any):
        self.server = server

    async def generate(self, prompt: list[int], params: SamplingParams) -> Generation:
        return await self.server.probe.remote(prompt, params)


class ArlHFServerAdapter(BaseRollout):
    """verl's in-trainer rollout handle for `ArlHFServer` (see the module docstring)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        per_replica = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                       * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // per_replica if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % per_replica
        self.server: Any = None
        self.canary: Any = None
        self.reference: torch.nn.Module | None = None

    def _server(self) -> Any:
        if self.server is None:
            self.server = ray.get_actor(server_name(self.replica_rank))
        return self.server

    async def resume(self, tags: list[str]) -> None:
        return None  # the engine never releases its weights

    async def release(self) -> None:
        return None

    @torch.no_grad()
    async def update_weights(self, weights: Any, global_steps: int | None = None,
                             wire_format: str = "named_tensors", peft_config: Any = None, **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the arl_hf rollout takes full tensors, not {wire_format!r}")
        if peft_config is not None:
            raise NotImplementedError("the arl_hf rollout has no LoRA weight sync (model.lora.merge=True merges)")
        lead = self.rollout_rank == 0
        tensors = []
        for name, tensor in weights:  # every rank: the FSDP engine's full_tensor() gathers are collectives
            if lead:
                tensors.append((name, tensor.detach().to("cpu", torch.float32, copy=True)))
        if not lead:
            return
        start = time.perf_counter()
        server = self._server()
        version = await server.update_weights.remote(tensors, global_steps)
        metrics = {"arl_sync/push_s": time.perf_counter() - start}
        metrics.update(await self._canary(tensors, global_steps))
        await server.record_sync.remote(metrics)
        log.info("arl_hf replica %d: weights of global step %s loaded (engine version %d); canary gap max %.3g "
                 "mean %.3g", self.replica_rank, global_steps, version, metrics.get("arl_sync/canary_max_abs", -1.0),
                 metrics.get("arl_sync/canary_mean_abs", -1.0))

    async def _canary(self, tensors: list[tuple[str, torch.Tensor]], global_steps: int | None) -> dict[str, float]:
        from arl.engine.hf import HFEngine
        from arl.train.canary import SyncCanary

        if self.reference is None:
            from transformers import AutoModelForCausalLM

            path = self.model_config.local_path or self.model_config.path
            self.reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            self.canary = SyncCanary(_RemoteEngine(self._server()), self.reference, self.model_config.tokenizer,
                                     precision="fp32", engine_dtype="float32")
        # the reference holds exactly the pushed tensors (HFEngine's loader: names, shapes, tied weights)
        HFEngine._load(_Holder(self.reference), tensors)
        pushed = {name for name, _ in tensors}
        missing = [n for n, _ in self.reference.named_parameters() if n not in pushed
                   and not _tied(self.reference, n, pushed)]
        if missing:
            raise RuntimeError(f"verl's weight sync left {len(missing)} parameter(s) out: {missing[:5]}")
        metrics = await self.canary.check(pushed="full weights (verl naive sync)", when=f"global step {global_steps}")
        return {f"arl_sync/{k.removeprefix('sync/')}": v for k, v in metrics.items()}

    def generate_sequences(self, prompts: Any) -> Any:
        raise NotImplementedError("the arl_hf rollout is served through its replica (LLMServerClient)")


class _Holder:
    """What `HFEngine._load` reads from its engine: the model, no LoRA."""

    _lora_config = None

    def __init__(self, model: torch.nn.Module):
        self.model = model


def _tied(model: torch.nn.Module, name: str, pushed: set[str]) -> bool:
    """``name`` shares its Parameter with a pushed name (tied embeddings)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    target = params.get(name)
    return any(params.get(other) is target for other in pushed if other in params)
