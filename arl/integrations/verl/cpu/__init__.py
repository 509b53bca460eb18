"""verl 0.9.1 on the CPU: a platform, three patches, and arl's HF engine as the rollout.

    VERL_USE_EXTERNAL_MODULES=arl.integrations.verl.cpu VERL_PLATFORM=cpu python -m verl.trainer.main_ppo \\
        actor_rollout_ref.rollout.name=arl_hf actor_rollout_ref.actor.strategy=fsdp2 trainer.device=cpu ...
        +ray_kwargs.ray_init.num_gpus=<trainer processes> ...

(`arl/integrations/verl/examples/cpu_fit.sh` is the whole launch.) How it reaches every process:
``import verl`` imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` (verl/__init__.py,
`verl.utils.import_utils.import_external_libs`); Ray's worker processes inherit the driver's
environment, so the driver, verl's TaskRunner, its trainer workers, agent-loop and reward workers and
the rollout servers all import this package as soon as they import verl, before verl resolves its
platform. With ``VERL_PLATFORM=cpu`` (verl's own platform override) importing it calls `activate`;
without, it only registers (tests import it that way).

`activate`:
1. refuses any verl but 0.9.1 (`patches.UnsupportedVerlError`);
2. registers `platform.PlatformCPU` as ``cpu`` in verl's ``PlatformRegistry`` and makes it the
   process's platform (``set_platform``): device ``cpu``, backend gloo, Ray resource ``GPU``;
3. applies `patches.PATCHES` as their verl modules load: the process-group string, the FSDP2
   engines for device ``cpu`` and FSDP2's unpinned offload for the reference (each described in
   `arl.integrations.verl.cpu.patches`);
4. registers ``rollout.name=arl_hf`` (`arl.integrations.verl.cpu.rollout`) in verl's
   ``RolloutReplicaRegistry`` and ``_ROLLOUT_REGISTRY`` as those modules load.
"""

from __future__ import annotations

import os
from types import ModuleType

from arl.integrations.verl.cpu import patches

ROLLOUT_NAME = "arl_hf"
ROLLOUT_ADAPTER = "arl.integrations.verl.cpu.rollout.ArlHFServerAdapter"


def _load_replica():
    from arl.integrations.verl.cpu.rollout import ArlHFReplica

    return ArlHFReplica


def _check_replica_registry(module: ModuleType) -> None:
    if not hasattr(getattr(module, "RolloutReplicaRegistry", None), "register"):
        raise patches.PatchTargetChanged("verl.workers.rollout.replica.RolloutReplicaRegistry is gone")


def _register_replica(module: ModuleType) -> None:
    module.RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)


def _check_rollout_registry(module: ModuleType) -> None:
    if not isinstance(getattr(module, "_ROLLOUT_REGISTRY", None), dict):
        raise patches.PatchTargetChanged("verl.workers.rollout.base._ROLLOUT_REGISTRY is gone")


def _register_adapter(module: ModuleType) -> None:
    module._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ROLLOUT_ADAPTER


# registrations, not patches: verl's registries are meant to take new entries
REGISTRATIONS = (
    patches.Patch("rollout replica arl_hf", "verl.workers.rollout.replica", _check_replica_registry,
                  _register_replica),
    patches.Patch("rollout adapter arl_hf", "verl.workers.rollout.base", _check_rollout_registry, _register_adapter),
)


def register_platform() -> None:
    from verl.plugin.platform import PlatformRegistry

    from arl.integrations.verl.cpu.platform import PLATFORM, PlatformCPU

    if PlatformRegistry.get(PLATFORM) is not PlatformCPU:
        PlatformRegistry.register(PLATFORM)(PlatformCPU)


def activate() -> None:
    """Make this process's verl a CPU verl (see the module docstring); idempotent."""
    patches.check_version()
    register_platform()
    from verl.plugin.platform import platform_manager

    from arl.integrations.verl.cpu.platform import PlatformCPU

    if not isinstance(platform_manager._current_platform, PlatformCPU):
        platform_manager.set_platform(PlatformCPU())
    patches.apply(patches.PATCHES + REGISTRATIONS)


def requested() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"


if requested():
    activate()
else:
    register_platform()
