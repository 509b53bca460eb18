"""One sandbox interface, several backends (issue 48 item 1): the same contract and error policy for
bwrap, podman, docker and none, each run where this machine has it and skipped with the reason
where not; the container backend's own promises (local image only, no network, read-only root,
limits, owner label, orphans reaped); the BugFix env and pull mode unchanged in a container.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess

import anyio
import pytest

from arl.config import SANDBOX_BACKENDS, ManagerConfig, ProxyConfig, RolloutConfig
from arl.envs.bugfix import BugFixEnv, assistant_message, generate_task, solution_calls
from arl.envs.bugfix import judge as judge_module
from arl.sandbox import backends
from arl.sandbox.backends import BACKENDS, backend_problem, choose_backend, open_sandbox
from arl.sandbox.sandbox import SandboxDied, SandboxLimits, SandboxUnavailable

pytestmark = pytest.mark.anyio
CONCRETE = [pytest.param(b, marks=pytest.mark.skipif(backend_problem(b) is not None,
                                                      reason=f"{b} unavailable here: {backend_problem(b)}"))
            for b in ("bwrap", "podman", "docker", "none")]
CONTAINERS = [pytest.param(r, marks=pytest.mark.skipif(backend_problem(r) is not None,
                                                       reason=f"{r} unavailable here: {backend_problem(r)}"))
              for r in ("podman", "docker")]
LIMITS = SandboxLimits(wall_s=10.0, cpu_s=10.0)


@pytest.fixture(autouse=True)
def _keep_default_backend():
    before = backends.default_backend()
    yield
    backends.set_default_backend(before)


def test_config_names_the_same_backends():
    assert SANDBOX_BACKENDS == BACKENDS
    with pytest.raises(ValueError, match="one of"):
        choose_backend("lxc")


def test_auto_is_bwrap_where_it_starts_else_the_next_available():
    assert choose_backend("auto") == backends.available_backends()[0]
    assert backends.available_backends()[-1] == "none"


@pytest.mark.parametrize("backend", CONCRETE)
async def test_the_contract_is_the_same_for_every_backend(backend):
    sandbox = await open_sandbox(LIMITS, backend=backend, python=True).start()
    try:
        assert sandbox.isolation == backend
        ok = await sandbox.exec(["python", "-c", "import os; print(os.environ['A'], os.getcwd())"],
                                env={"A": "x"}, workdir=sandbox.cwd)
        assert ok.ok and ok.stdout.split() == ["x", sandbox.cwd]
        sandbox.write_file("sub/f.txt", "hello")
        cat = await sandbox.exec(["cat", "f.txt"], workdir=f"{sandbox.cwd}/sub")
        assert cat.stdout == "hello"
        # the command's faults are results, never exceptions
        assert (await sandbox.exec(["sleep", "30"], timeout=1)).status == "timeout"
        missing = await sandbox.exec(["no-such-program-arl"])
        assert missing.status == "ok" and missing.exit_code == 127
        crash = await sandbox.exec(["python", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
        assert crash.status == "killed" and crash.signal == 11
        flood = await sandbox.exec(["python", "-c", "print('x' * 100000)"])
        assert flood.truncated and len(flood.stdout) <= LIMITS.output_bytes
        assert (await sandbox.exec(["sh", "-c", "exit 3"])).exit_code == 3
    finally:
        await sandbox.stop()
    assert sandbox.closed and not sandbox.workdir.exists()
    with pytest.raises(SandboxDied):  # the sandbox's own failure raises
        await sandbox.exec(["true"])


@pytest.mark.parametrize("backend", CONCRETE)
async def test_stop_finishes_when_its_caller_is_cancelled(backend):
    sandbox = await open_sandbox(LIMITS, backend=backend).start()
    await sandbox.exec(["true"])
    with anyio.move_on_after(0.001):
        await sandbox.stop()
    await asyncio.sleep(0)  # nothing left to wait for: stop finished before the cancellation went on
    assert sandbox.closed and not sandbox.workdir.exists()


def test_none_is_loud_about_what_it_does_not_isolate(caplog):
    backends._warned.clear()
    with caplog.at_level(logging.WARNING, logger="arl.sandbox.backends"):
        sandbox = open_sandbox(LIMITS, backend="none")
        open_sandbox(LIMITS, backend="none").close_sync()  # once per process, not per sandbox
    try:
        assert len(caplog.records) == 1
        warning = sandbox.isolation_warning
        assert warning is not None and warning.backend == "none"
        assert "network namespace" in warning.lost and "host file system protection" in warning.lost
        assert any("not isolated: network namespace" in r.getMessage() for r in caplog.records)
    finally:
        sandbox.close_sync()


def test_a_named_backend_that_cannot_start_says_why(monkeypatch):
    monkeypatch.setattr(backends, "backend_problem", lambda b: "not here (test)" if b == "docker" else None)
    with pytest.raises(SandboxUnavailable, match="'docker' cannot start here: not here"):
        open_sandbox(LIMITS, backend="docker")


# -- the container backend ----------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", CONTAINERS)
async def test_container_isolation_and_limits(runtime):
    from arl.sandbox.oci import LABEL, OWNER_LABEL, owner

    limits = SandboxLimits(wall_s=20.0, cpu_s=10.0, max_procs=32, total_memory_bytes=256 * 2**20)
    sandbox = await open_sandbox(limits, backend=runtime, python=True).start()
    try:
        net = await sandbox.exec(["python", "-c", "import os; print(sorted(os.listdir('/sys/class/net')))"])
        assert net.stdout.strip() == "['lo']"
        ro = await sandbox.exec(["sh", "-c", "touch /etc/x || echo refused; touch /workspace/y && echo wrote"])
        assert ro.stdout.split() == ["refused", "wrote"]
        keyring = await sandbox.exec(["python", "-c", "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
                                      "libc.syscall.restype = ctypes.c_long; r = libc.syscall(250, 0, -4, 0); "
                                      "print(r, ctypes.get_errno())"])  # KEYCTL_GET_KEYRING_ID of the user keyring
        assert keyring.stdout.split() == ["-1", "38"], keyring  # ENOSYS: a uid's user keyring outlives its sandbox
        uid = await sandbox.exec(["id", "-u"])
        assert int(uid.stdout) == sandbox.uid != 0
        hidden = await sandbox.exec(["sh", "-c", f"ls {os.path.dirname(judge_module.ARL_PACKAGE)} /root 2>&1"])
        assert "arl" not in hidden.stdout.split()  # arl's source (the task generator) is not there
        bomb = await sandbox.exec(["python", "-c", "import os\nn = 0\ntry:\n  while True:\n    os.fork() or os._exit(0) if False else None\n    pid = os.fork()\n    if pid == 0:\n      import time; time.sleep(20); os._exit(0)\n    n += 1\nexcept OSError:\n  print('refused', n)\n"])
        assert bomb.stdout.startswith("refused") and int(bomb.stdout.split()[1]) < limits.max_procs
        assert (await sandbox.exec(["true"])).ok  # the uid's leftovers were reaped
        inspect = subprocess.run([runtime, "inspect", "-f", "{{index .Config.Labels \"" + LABEL + "\"}} "
                                  "{{index .Config.Labels \"" + OWNER_LABEL + "\"}} {{.HostConfig.NetworkMode}} "
                                  "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.PidsLimit}} {{.HostConfig.Memory}}",
                                  sandbox.container], capture_output=True, text=True, check=True)
        assert inspect.stdout.split() == ["1", owner(), "none", "true", "32", str(256 * 2**20)]
    finally:
        await sandbox.stop()
    gone = subprocess.run([runtime, "ps", "-a", "-q", "--filter", f"name={sandbox.container}"],
                          capture_output=True, text=True)
    assert gone.stdout.strip() == ""


@pytest.mark.parametrize("runtime", CONTAINERS)
async def test_a_container_that_died_raises_and_a_missing_image_is_never_pulled(runtime):
    from arl.sandbox.oci import _rm

    sandbox = await open_sandbox(LIMITS, backend=runtime).start()
    try:
        subprocess.run(_rm(runtime, sandbox.container), capture_output=True, check=True)
        with pytest.raises(SandboxDied, match="died|gone"):
            await sandbox.exec(["true"])
    finally:
        await sandbox.stop()
    with pytest.raises(SandboxUnavailable, match="never pulls"):
        open_sandbox(LIMITS, backend=runtime, image="docker.io/library/alpine:3.19")


@pytest.mark.parametrize("runtime", CONTAINERS)
async def test_a_container_that_dies_while_a_command_runs_raises(runtime):
    """docker exec into a container removed meanwhile exits 1 ("Error response from daemon"), like
    a command's own exit 1: it must still read as the sandbox's death, not as the command's."""
    from arl.sandbox.oci import _rm

    sandbox = await open_sandbox(LIMITS, backend=runtime).start()
    try:
        running = asyncio.ensure_future(sandbox.exec(["sleep", "8"]))
        await asyncio.sleep(1.5)
        await asyncio.to_thread(subprocess.run, _rm(runtime, sandbox.container), capture_output=True, check=True)
        with pytest.raises(SandboxDied):
            await running
    finally:
        await sandbox.stop()


@pytest.mark.parametrize("runtime", CONTAINERS)
def test_orphaned_containers_are_reaped(runtime):
    from arl.sandbox.oci import (
        LABEL,
        OWNER_LABEL,
        _init_args,
        _probe,
        _run_prefix,
        _ulimit_args,
        reap_orphans,
    )

    done = subprocess.Popen(["true"])  # a pid that has ended: the owner is gone
    done.wait()
    name = f"arl-orphan-test-{os.getpid()}"
    _, oci, image = _probe(runtime)
    flags, init = _init_args(runtime)
    subprocess.run([*_run_prefix(runtime, oci), "-d", "--pull", "never", *flags, "--name", name,
                    "--label", f"{LABEL}=1", "--label", f"{OWNER_LABEL}=x:{done.pid}:0", "--network", "none",
                    *_ulimit_args(LIMITS), "-v", "/usr:/usr:ro", image, *init, "/usr/bin/sleep", "60"],
                   capture_output=True, check=True)
    assert name in reap_orphans(runtime)
    left = subprocess.run([runtime, "ps", "-a", "-q", "--filter", f"name={name}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


@pytest.mark.parametrize("runtime", CONTAINERS)
async def test_bugfix_env_and_its_judge_run_in_the_container(runtime):
    env = BugFixEnv(isolation=runtime)
    try:
        _, info = env.reset(seed=3)
        assert info["isolation"] == runtime
        reward = None
        for name, arguments in solution_calls(generate_task(3)):
            _, reward, _, _, info = await env.astep(assistant_message(name, arguments))
        assert reward == 1.0 and info["tests_passed"] == info["tests_total"]
    finally:
        env.close()


@pytest.mark.parametrize("runtime", CONTAINERS)
async def test_pull_mode_runs_in_the_container_as_under_bwrap(tiny_tokenizer, runtime):
    """The pull-mode agent, configured by ``rollout.sandbox.backend``: the same samples as under bwrap."""
    from arl.engine.scripted import ScriptedEngine
    from arl.rollout import EpisodeSpec
    from arl.rollout.factory import close_manager, make_manager

    runs = {}
    for backend in (runtime, "bwrap") if backend_problem("bwrap") is None else (runtime,):
        engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.3)
        rollout = RolloutConfig(env_id="arl/FrozenLake-v0", mode="proxy", manager=ManagerConfig(max_tokens=24),
                                proxy=ProxyConfig(runner="pull", runner_kwargs={
                                    "command": ["{python}", "-m", "arl.agents.examples.gym_agent"], "timeout_s": 120}))
        rollout.sandbox.backend = backend
        manager = make_manager(engine, rollout)
        assert backends.default_backend() == backend
        try:
            episode = await manager.run_episode(EpisodeSpec(env_id=rollout.env_id, seed=1, group_id="g", episode_id=0))
        finally:
            await close_manager(manager)
        assert episode.trajectory.status == "Finished", episode.trajectory.error
        runs[backend] = episode
    if "bwrap" in runs:
        a, b = runs[runtime], runs["bwrap"]
        assert a.trajectory.episode_score == b.trajectory.episode_score and len(a.samples) == len(b.samples) > 0
        assert [(x.input_ids, x.response_mask) for x in a.samples] == [(y.input_ids, y.response_mask) for y in b.samples]


def test_the_image_is_built_from_this_host_alone_and_named_by_its_content(monkeypatch):
    from arl.sandbox import oci

    first, second = oci.rootfs_tar(), oci.rootfs_tar()
    assert first == second and oci.image_tag(first) == oci.image_tag(second)
    assert oci.image_tag(first).startswith(oci.IMAGE_REPO + ":")


def test_docker_without_its_daemon_says_how_to_start_it(monkeypatch):
    """No init system starts dockerd in a container: the refusal names the script that does."""
    from arl.sandbox import oci

    def run(argv, *args, **kwargs):
        assert argv[:2] == ["docker", "info"], argv  # nothing past the engine's answer
        return subprocess.CompletedProcess(argv, 1, b"", b"Cannot connect to the Docker daemon at "
                                           b"unix:///var/run/docker.sock. Is the docker daemon running?\n")

    monkeypatch.setattr(oci.shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}")
    monkeypatch.setattr(oci.os, "geteuid", lambda: 0)
    monkeypatch.setattr(oci, "_run", run)
    problem, _, _ = oci._problem("docker")
    assert problem.startswith("docker cannot reach its engine: Cannot connect to the Docker daemon")
    assert "scripts/dockerd.sh" in problem


def _cgroup_mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split(" - ", 1)[1].split()[0] for line in f if line.split()[4].startswith("/sys/fs/cgroup")]


def test_rootless_podman_is_refused_naming_the_host_condition_that_fails(monkeypatch):
    """Measured on this hybrid-cgroup host (podman 4.3, a user with subordinate ids): crun refuses
    the host, runc runs a rootless container but ignores its --memory/--pids-limit/--cpus. The
    refusal names that condition where the host has it, and what no host changes (a sandbox's own
    uid); a host that lacks subordinate ids or newuidmap is told so, each with its fix."""
    from arl.sandbox import oci

    monkeypatch.setattr(oci.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(oci.shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}")
    problem, _, _ = oci._problem("podman")
    assert problem is not None and problem.startswith("podman runs rootless here (uid 1000)")
    assert "outside every subordinate range" in problem and "run arl as root" in problem
    hybrid = _cgroup_mounts() != ["cgroup2"]  # this host: tmpfs + v1 hierarchies + a cgroup2 at .../unified
    assert ("Resource limits are not supported and ignored on cgroups V1 rootless systems" in problem) == hybrid
    assert "docker as a non-root user" in oci._problem("docker")[0]

    good = dict(user="arl", uid=1001, subuid="arl:100000:65536\n", subgid="1001:100000:65536\n",
                idmap_tools=True, cgroup_v2_only=True, delegated=frozenset({"memory", "pids", "cpu", "io"}))
    assert oci.rootless_conditions(**good) == []
    for change, expected in [({"subuid": "bob:100000:65536\n"}, "usermod --add-subuids"),
                             ({"idmap_tools": False}, "apt-get install uidmap"),
                             ({"cgroup_v2_only": False}, "cgroups are v1 or a v1/v2 hybrid"),
                             ({"delegated": frozenset({"memory", "io"})}, "no cpu, pids controller delegated")]:
        found = oci.rootless_conditions(**{**good, **change})
        assert len(found) == 1 and expected in found[0], (change, found)


@pytest.mark.parametrize("runtime", CONTAINERS)
async def test_a_container_command_env_is_on_no_host_command_line(runtime):
    """``podman exec --env K=V`` put an episode's values in the client's argv, which every user of
    the host reads in /proc/<pid>/cmdline (issue 47): the values go through an unnamed env file."""
    secret = "arl-env-secret-" + os.urandom(6).hex()
    seen: list[str] = []
    async with open_sandbox(LIMITS, backend=runtime, env={"ARL_SECRET": secret}) as sb:
        running = asyncio.ensure_future(sb.run('echo "$ARL_SECRET" "$ARL_OTHER"; sleep 3',
                                               env={"ARL_OTHER": "second=value with spaces"}))
        for _ in range(40):  # while the command runs: every command line on the host
            await asyncio.sleep(0.1)
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    try:
                        with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                            line = f.read()
                    except OSError:
                        continue
                    if secret.encode() in line or b"second=value" in line:
                        seen.append(line.replace(b"\0", b" ").decode(errors="replace"))
        result = await running
        assert secret not in sb.command_line("true")
        with pytest.raises(ValueError, match="line break"):
            await sb.run("true", env={"ARL_BAD": "one\nARL_INJECTED=two"})
    assert result.stdout == f"{secret} second=value with spaces\n", result
    assert seen == [], f"the env on a host command line: {seen[:2]}"
