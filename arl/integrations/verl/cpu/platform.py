"""`PlatformCPU`: verl's platform interface (`verl.plugin.platform.PlatformBase`) for the host CPU.

verl 0.9.1 ships platforms for CUDA, Ascend NPU and ROCm only; every device call in verl goes
through the current platform (`verl.utils.device`), so most of a CPU run is this class:

- ``device_name`` ``cpu``: tensors, device meshes (``init_device_mesh("cpu", ...)``), the FSDP2
  engine and autocast all take it as is.
- ``current_device()`` returns ``"cpu"`` (what ``torch.cpu.current_device()`` returns), not an
  integer index: verl passes `get_device_id()` straight to ``.to()``, ``to_empty(device=...)``,
  ``torch.device(...)`` and ``torch.tensor(device=...)`` (fsdp_utils, the FSDP engine, protocol),
  where an integer means ``cuda:<i>``. So these calls keep working unpatched; the base class
  annotates ``-> int``, which no caller relies on (tests/integrations/verl/test_cpu_patches.py,
  ``test_platform_device_id_is_what_verl_passes_to_to``, lists the call sites).
- ``communication_backend_name()`` ``gloo``; the ``cpu:gloo,cpu:gloo`` string verl builds from it
  is the one thing torch refuses (`arl.integrations.verl.cpu.patches`).
- Ray resource: ``GPU``. The launch declares logical GPUs to Ray (``ray_init.num_gpus``, one per
  trainer process), so verl's placement groups, ``num_gpus`` actor options, ``get_accelerator_ids``
  and its resource-pool check (which counts only ``GPU``/``NPU``) all work unchanged. Ray then sets
  ``CUDA_VISIBLE_DEVICES`` in those processes, which CPU torch ignores.
- the device module is `CPUDeviceModule`: ``torch.cpu`` plus what verl calls on
  ``torch.cuda`` that ``torch.cpu`` lacks (``empty_cache``, memory statistics, ``mem_get_info``, rng
  state, ``manual_seed``), as no-ops or host figures.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

import torch
from verl.plugin.platform import PlatformBase

PLATFORM = "cpu"  # the name under verl's PlatformRegistry and in VERL_PLATFORM


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory."""
    try:
        import psutil

        mem = psutil.virtual_memory()
        return int(mem.available), int(mem.total)
    except ImportError:  # pragma: no cover - psutil is a ray dependency
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size, pages * size


class CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` with the ``torch.cuda`` calls verl makes that have no CPU meaning."""

    def __init__(self) -> None:
        super().__init__("arl_verl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def set_device(device: Any) -> None:  # one device: nothing to select
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return _host_memory()

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


DEVICE_MODULE = CPUDeviceModule()


class PlatformCPU(PlatformBase):
    """verl's platform for the host CPU (see the module docstring)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # never auto-detected: chosen with VERL_PLATFORM=cpu (verl's own override)
        return False

    def current_device(self) -> str:  # type: ignore[override]  # see the module docstring
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the logical GPUs

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
