"""The patches verl 0.9.1 needs to train on the CPU, applied in each process as verl's modules load.

No file of verl is edited. `apply()` checks verl's version (`VERL_VERSION`; anything else is refused
with `UnsupportedVerlError`, because each patch below encodes what one version's code does) and
then registers a post-import hook per target module: the patch runs right after verl's module
executes, before any other module can ``from ... import`` the patched name, and a process that never
imports the module never pays for it. Each patch first checks that verl's code still looks as the
patch assumes (`PatchTargetChanged` otherwise) -- so a verl release that fixes or moves the thing
fails loudly here, and in tests/integrations/verl/test_cpu_patches.py, instead of patching blindly.

What a CPU run of verl 0.9.1 needs beyond the platform (`arl.integrations.verl.cpu.platform`):

1. `PROCESS_GROUP` -- ``verl.utils.distributed.initialize_global_process_group_ray``. verl: every
   training worker (``TrainingWorker.__init__``) calls it with no backend, and it builds
   ``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``. On CPU: that is ``cpu:gloo,cpu:gloo``,
   which torch refuses ("Duplicate device type cpu in backend string"). Patch: where the platform's
   device is ``cpu`` and no backend is given, the backend is ``cpu:gloo``; anything else goes to
   verl's function unchanged.
2. `FSDP_ENGINES` -- ``verl.workers.engine.fsdp.transformer_impl``. verl registers its FSDP engines
   (``FSDPEngineWithLMHead`` for the actor and reference, ``FSDPEngineWithValueHead`` for a critic)
   in ``EngineRegistry`` for ``device=["cuda", "npu"]`` only, and looks them up by the platform's
   device name. On CPU: "No engine registered for device='cpu'". Patch: the same classes are
   registered for ``cpu`` too, under the ``fsdp2`` backend only (the FSDP2 code path runs on
   CPU with gloo as is). FSDP1 (``strategy=fsdp``) is left unregistered, so verl itself refuses it
   ("No engine registered for device='cpu' ... backend='fsdp'"): it passes
   ``device_id=get_device_id()`` to ``FullyShardedDataParallel``, which takes no CPU device.

3. `UNPINNED_OFFLOAD` -- ``verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy``. verl:
   ``FSDPEngine._build_fsdp_module`` gives every forward-only FSDP2 module (the reference policy)
   ``CPUOffloadPolicy(pin_memory=True)``. On CPU: FSDP2 pins each shard, and pinning needs an
   accelerator ("RuntimeError: Cannot access accelerator device when none is available"). Patch: the
   name ``CPUOffloadPolicy`` in that module is a subclass whose ``pin_memory`` is always False (the
   shards already live in host memory; nothing else about the policy changes).

Not patched, because the platform covers them: integer device ids passed to ``.to()`` (the platform's
``current_device()`` is ``"cpu"``); the resource pool counting only GPUs (the launch declares logical
GPUs to Ray). See the platform module.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import inspect
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import attrs

log = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"  # the only version these patches were written for and tested on


class UnsupportedVerlError(RuntimeError):
    """verl is not the version the CPU patches were written for."""


class PatchTargetChanged(RuntimeError):
    """verl's code no longer looks as a patch assumes (fixed, moved or rewritten)."""


def verl_version() -> str:
    return importlib.metadata.version("verl")


def check_version(version: str | None = None) -> None:
    version = version or verl_version()
    if version != VERL_VERSION:
        raise UnsupportedVerlError(
            f"arl.integrations.verl.cpu patches verl {VERL_VERSION}; this is verl {version}. Each patch "
            "replaces a piece of one version's code (see the module docstring), so it is not applied to "
            f"another: install verl=={VERL_VERSION}, or re-check every patch against this version's code."
        )


@attrs.frozen
class Patch:
    """One change to one verl module: ``apply(module)`` after ``check(module)`` passed."""

    name: str
    module: str
    check: Callable[[ModuleType], None]
    apply: Callable[[ModuleType], None]


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError) as exc:
        raise PatchTargetChanged(f"cannot read verl's source of {obj!r} to check a CPU patch: {exc}") from exc


# -- 1. the process-group backend string ------------------------------------------------------------

VERL_BACKEND_EXPR = 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'


def _check_process_group(module: ModuleType) -> None:
    fn = getattr(module, "initialize_global_process_group_ray", None)
    if fn is None:
        raise PatchTargetChanged("verl.utils.distributed.initialize_global_process_group_ray is gone")
    if VERL_BACKEND_EXPR not in _source(fn):
        raise PatchTargetChanged(
            "verl.utils.distributed.initialize_global_process_group_ray no longer builds its default backend "
            f"as {VERL_BACKEND_EXPR}: the CPU patch for it must be re-checked")


def _apply_process_group(module: ModuleType) -> None:
    original = module.initialize_global_process_group_ray
    if getattr(original, "__arl_cpu_patch__", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None and module.get_device_name() == "cpu":
            backend = "cpu:gloo"  # verl's default would name the cpu device twice
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray.__arl_cpu_patch__ = True
    initialize_global_process_group_ray.__wrapped__ = original
    initialize_global_process_group_ray.__doc__ = (
        "arl's CPU patch of verl's function (arl.integrations.verl.cpu.patches, PROCESS_GROUP)")
    module.initialize_global_process_group_ray = initialize_global_process_group_ray


PROCESS_GROUP = Patch("process-group backend", "verl.utils.distributed", _check_process_group,
                      _apply_process_group)


# -- 2. FSDP engines for device "cpu" ---------------------------------------------------------------

FSDP_ENGINE_CLASSES = {"language_model": "FSDPEngineWithLMHead", "value_model": "FSDPEngineWithValueHead"}
FSDP_BACKENDS = ("fsdp", "fsdp2")
VERL_FSDP_DEVICES = {"cuda", "npu"}
CPU_BACKENDS = ("fsdp2",)  # FSDP1 needs a device id (see the module docstring)


def _registry() -> dict[str, Any]:
    from verl.workers.engine.base import EngineRegistry

    return EngineRegistry._engines


def _check_fsdp_engines(module: ModuleType) -> None:
    registry = _registry()
    for model_type, cls_name in FSDP_ENGINE_CLASSES.items():
        cls = getattr(module, cls_name, None)
        if cls is None:
            raise PatchTargetChanged(f"verl.workers.engine.fsdp.transformer_impl.{cls_name} is gone")
        for backend in FSDP_BACKENDS:
            entries = registry.get(model_type, {}).get(backend, {})
            devices = {key for key, value in entries.items() if value is cls}
            if devices != VERL_FSDP_DEVICES and devices != VERL_FSDP_DEVICES | {"cpu"}:
                raise PatchTargetChanged(
                    f"verl registers {cls_name} ({model_type}, {backend}) for {sorted(devices)}, not "
                    f"{sorted(VERL_FSDP_DEVICES)}: the CPU registration must be re-checked")


def _apply_fsdp_engines(module: ModuleType) -> None:
    registry = _registry()
    for model_type, cls_name in FSDP_ENGINE_CLASSES.items():
        for backend in FSDP_BACKENDS:
            if backend in CPU_BACKENDS:
                registry[model_type][backend].setdefault("cpu", getattr(module, cls_name))


FSDP_ENGINES = Patch("FSDP engines for device cpu", "verl.workers.engine.fsdp.transformer_impl",
                     _check_fsdp_engines, _apply_fsdp_engines)

# -- 3. no pinned memory for FSDP2's offload policy --------------------------------------------------

VERL_PINNED_POLICY_EXPR = "CPUOffloadPolicy(pin_memory=True)"


def _check_unpinned_offload(module: ModuleType) -> None:
    engine = getattr(module, "FSDPEngine", None)
    if engine is None or getattr(module, "CPUOffloadPolicy", None) is None:
        raise PatchTargetChanged("verl.workers.engine.fsdp.transformer_impl.FSDPEngine/CPUOffloadPolicy is gone")
    if getattr(module.CPUOffloadPolicy, "__arl_cpu_patch__", False):
        return
    if VERL_PINNED_POLICY_EXPR not in _source(engine._build_fsdp_module):
        raise PatchTargetChanged(
            f"FSDPEngine._build_fsdp_module no longer builds {VERL_PINNED_POLICY_EXPR}: the CPU patch for it "
            "must be re-checked")


def _apply_unpinned_offload(module: ModuleType) -> None:
    base = module.CPUOffloadPolicy
    if getattr(base, "__arl_cpu_patch__", False):
        return

    class CPUOffloadPolicy(base):
        """arl's CPU patch (arl.integrations.verl.cpu.patches, UNPINNED_OFFLOAD): never pinned."""

        __arl_cpu_patch__ = True

        def __init__(self, pin_memory: bool = True):
            super().__init__(pin_memory=False)

    module.CPUOffloadPolicy = CPUOffloadPolicy


UNPINNED_OFFLOAD = Patch("FSDP2 offload policy unpinned", "verl.workers.engine.fsdp.transformer_impl",
                         _check_unpinned_offload, _apply_unpinned_offload)

PATCHES = (PROCESS_GROUP, FSDP_ENGINES, UNPINNED_OFFLOAD)


# -- applying them: a post-import hook per target module ----------------------------------------------

class _HookedLoader(importlib.abc.Loader):
    """verl's own loader for the module, then the patches (every other attribute: the loader's)."""

    def __init__(self, loader: Any, patches: list[Patch]):
        self._loader, self._patches = loader, patches

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        for patch in self._patches:
            _run(patch, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.pending: dict[str, list[Patch]] = {}
        self._lock = threading.Lock()

    def find_spec(self, fullname, path, target=None):
        with self._lock:
            if fullname not in self.pending:
                return None
            patches = self.pending.pop(fullname)
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _HookedLoader(spec.loader, patches)
                return spec
        with self._lock:  # not found: leave the patches pending, the import fails as it would
            self.pending.setdefault(fullname, []).extend(patches)
        return None


_FINDER = _PostImportFinder()
_applied: set[str] = set()


def _run(patch: Patch, module: ModuleType) -> None:
    patch.check(module)
    patch.apply(module)
    _applied.add(patch.name)
    log.debug("arl verl cpu patch applied: %s (%s)", patch.name, patch.module)


def apply(patches: tuple[Patch, ...] = PATCHES) -> None:
    """Apply ``patches`` now where their module is loaded, else right after it loads (idempotent)."""
    check_version()
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    for patch in patches:
        module = sys.modules.get(patch.module)
        if module is not None and getattr(module, "__spec__", None) is not None and patch.name not in _applied:
            _run(patch, module)
        elif patch.name not in _applied:
            with _FINDER._lock:
                pending = _FINDER.pending.setdefault(patch.module, [])
                if patch not in pending:
                    pending.append(patch)


def applied() -> set[str]:
    """Names of the patches applied in this process."""
    return set(_applied)
