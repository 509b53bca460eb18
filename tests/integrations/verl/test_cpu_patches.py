"""arl's CPU platform for verl 0.9.1 (`arl.integrations.verl.cpu`): each patch, against verl's code.

Two kinds of tests per patch: (a) in this process, verl unpatched -- the thing the patch replaces is
still there and still fails on the CPU (so a verl or torch release that fixes or moves it fails
here, and the patch can go); (b) in a fresh interpreter activated the way the launch does it
(``VERL_USE_EXTERNAL_MODULES=arl.integrations.verl.cpu VERL_PLATFORM=cpu``, then ``import verl``),
the patch is applied and does its job. Activation changes the process's verl platform, so (b) never
runs in the pytest process.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]

ACTIVATED = textwrap.dedent("""
    import json, os, sys
    import verl  # imports arl.integrations.verl.cpu (VERL_USE_EXTERNAL_MODULES) before anything else
    from verl.plugin.platform import get_platform
    from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_torch_device
    out = {"platform": type(get_platform()).__name__, "device": get_device_name(), "backend": get_nccl_backend(),
           "device_id": get_device_id()}
    import torch
    out["to_device_id"] = str(torch.ones(1).to(get_device_id()).device)
    get_torch_device().empty_cache(); get_torch_device().synchronize()
    out["mem_get_info"] = [int(x) > 0 for x in get_torch_device().mem_get_info()]

    # 1. the process group: what TrainingWorker.__init__ calls, with verl's own arguments
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
    from verl.workers import engine_workers
    engine_workers.initialize_global_process_group_ray(timeout_second=None)
    import torch.distributed as dist
    out["pg_backend"] = str(dist.get_backend())

    # 2. the FSDP engines for device cpu (fsdp2 only)
    from verl.workers.engine import EngineRegistry
    out["lm_engine"] = EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__
    out["value_engine"] = EngineRegistry.get_engine_cls("value_model", "fsdp2").__name__
    try:
        EngineRegistry.get_engine_cls("language_model", "fsdp")
        out["fsdp1"] = "registered"
    except ValueError as exc:
        out["fsdp1"] = str(exc)

    # 3. FSDP2 with verl's reference-policy offload policy, as FSDPEngine builds it
    from verl.workers.engine.fsdp import transformer_impl
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(get_device_name(), (1,))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    policy = transformer_impl.CPUOffloadPolicy(pin_memory=True)
    out["policy_pinned"] = policy.pin_memory
    fully_shard(model, mesh=mesh, offload_policy=policy)
    out["fsdp2_forward"] = list(model(torch.ones(3, 4)).shape)

    # registrations: the rollout registries
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class
    out["adapter"] = get_rollout_class("arl_hf", "async").__name__
    out["replica"] = get_rollout_replica_class("arl_hf").__name__
    from arl.integrations.verl.cpu import patches
    out["applied"] = sorted(patches.applied())
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out))
""")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def activated():
    """What a process activated like the launch's processes sees (one fresh interpreter)."""
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "arl.integrations.verl.cpu", "VERL_PLATFORM": "cpu",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", ACTIVATED, str(_free_port())], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


# -- the version guard ---------------------------------------------------------------------------------

def test_refuses_other_verl_versions():
    from arl.integrations.verl.cpu import patches

    patches.check_version()  # the installed one: 0.9.1
    assert patches.verl_version() == patches.VERL_VERSION == "0.9.1"
    with pytest.raises(patches.UnsupportedVerlError, match="verl 0.9.1; this is verl 0.9.2"):
        patches.check_version("0.9.2")


def test_activation_reaches_a_fresh_process_through_verls_external_modules(activated):
    assert activated["platform"] == "PlatformCPU"
    assert activated["applied"] == sorted(["process-group backend", "FSDP engines for device cpu",
                                           "FSDP2 offload policy unpinned", "rollout replica arl_hf",
                                           "rollout adapter arl_hf"])
    assert (activated["adapter"], activated["replica"]) == ("ArlHFServerAdapter", "ArlHFReplica")


def test_verl_imports_external_modules_in_every_process():
    """The mechanism activation relies on: verl/__init__.py imports VERL_USE_EXTERNAL_MODULES."""
    import verl

    source = Path(verl.__file__).read_text()
    assert 'os.getenv("VERL_USE_EXTERNAL_MODULES", "")' in source and "import_external_libs(modules)" in source


# -- the platform: device ids and the resource pool (no patch) ------------------------------------------

def test_platform_device_id_is_what_verl_passes_to_to(activated):
    """verl passes get_device_id() to .to()/to_empty()/torch.device(); an int there means cuda:<i>."""
    assert (activated["device"], activated["backend"], activated["device_id"]) == ("cpu", "gloo", "cpu")
    assert activated["to_device_id"] == "cpu" and activated["mem_get_info"] == [True, True]
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            torch.ones(1).to(0)  # what an integer device id (CUDA/NPU platforms) would do here
    from verl.utils import fsdp_utils
    from verl.workers.engine.fsdp import transformer_impl

    assert ".to(get_device_id()" in inspect.getsource(transformer_impl)
    assert "to_empty(device=get_device_id())" in inspect.getsource(fsdp_utils)


def test_resource_pool_counts_gpus_so_the_platform_declares_gpus():
    """verl's pool check counts GPU (or NPU) only: the platform's Ray resource must stay GPU."""
    from verl.single_controller.ray.base import ResourcePoolManager

    from arl.integrations.verl.cpu.platform import PlatformCPU

    assert 'node_info.get("GPU", 0)' in inspect.getsource(ResourcePoolManager._check_resource_available)
    assert PlatformCPU().ray_resource_name() == "GPU"
    assert PlatformCPU().ray_resource_options(0.5) == {"num_gpus": 0.5}


# -- 1. the process-group backend string ----------------------------------------------------------------

def test_process_group_patch_still_needed():
    from verl.utils import distributed
    from verl.workers import engine_workers

    from arl.integrations.verl.cpu import patches

    patches.PROCESS_GROUP.check(distributed)  # verl still builds "cpu:gloo,{device}:{backend}"
    assert "initialize_global_process_group_ray(timeout_second=None)" in inspect.getsource(
        engine_workers.TrainingWorker.__init__)
    with pytest.raises(ValueError, match="Duplicate device type cpu"):  # torch still refuses it
        torch.distributed.init_process_group(backend="cpu:gloo,cpu:gloo", rank=0, world_size=1,
                                             init_method=f"tcp://127.0.0.1:{_free_port()}")


def test_process_group_patch_gives_gloo(activated):
    assert activated["pg_backend"] == "cpu:gloo"


def test_process_group_check_refuses_a_changed_verl(tmp_path, monkeypatch):
    import importlib

    from arl.integrations.verl.cpu import patches

    (tmp_path / "fake_distributed.py").write_text(
        "def initialize_global_process_group_ray(timeout_second=None, backend=None):\n"
        "    backend = backend or 'gloo'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(patches.PatchTargetChanged, match="no longer builds its default backend"):
        patches.PROCESS_GROUP.check(importlib.import_module("fake_distributed"))


# -- 2. FSDP engines for device cpu -------------------------------------------------------------------

def test_fsdp_engine_registration_still_needed():
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    from arl.integrations.verl.cpu import patches

    patches.FSDP_ENGINES.check(transformer_impl)  # verl registers them for cuda and npu only
    for model_type in ("language_model", "value_model"):
        assert "cpu" not in EngineRegistry._engines[model_type]["fsdp2"]


def test_fsdp_engines_registered_for_cpu_fsdp2_only(activated):
    assert (activated["lm_engine"], activated["value_engine"]) == ("FSDPEngineWithLMHead", "FSDPEngineWithValueHead")
    assert "No engine registered for device='cpu'" in activated["fsdp1"]


# -- 3. FSDP2's offload policy unpinned ------------------------------------------------------------------

def test_unpinned_offload_patch_still_needed():
    from verl.workers.engine.fsdp import transformer_impl

    from arl.integrations.verl.cpu import patches

    patches.UNPINNED_OFFLOAD.check(transformer_impl)  # verl still pins the reference's shards
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="accelerator"):
            torch.ones(2).pin_memory()  # what FSDP2 does to each shard under pin_memory=True


def test_reference_offload_policy_shards_on_cpu(activated):
    assert activated["policy_pinned"] is False
    assert activated["fsdp2_forward"] == [3, 2]
