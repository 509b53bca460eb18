"""The config records sit at the bottom: reading a config loads no manager, server, engine or torch."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import arl.config
from arl.config import EngineConfig, ManagerConfig, ProxyConfig, RolloutConfig, TrainConfig, load_config
load_config("tiny_frozenlake_gigpo", ["rollout.mode=proxy"])
print(json.dumps(sorted(sys.modules)))
"""

# what `import arl` itself loads: the package facade registers the gymnasium games
ALLOWED_ARL = ("arl", "arl.config", "arl.envs", "arl.sandbox", "arl.sandbox.hostfs")  # hostfs: ToolEnv's encodable text


def test_import_arl_config_loads_no_manager_server_torch_or_aiohttp(tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    modules = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert "arl.config" in modules
    loaded_arl = sorted(m for m in modules if m.split(".")[0] == "arl")
    assert [m for m in loaded_arl if m not in ALLOWED_ARL and not m.startswith("arl.envs.")] == [], loaded_arl
    # named one by one, so a failure says which
    for heavy in ("arl.rollout", "arl.rollout.proxy", "arl.intercept.server", "arl.engine", "arl.train",
                  "torch", "aiohttp", "vllm", "transformers", "openai"):
        assert heavy not in modules, f"`import arl.config` loaded {heavy}"
