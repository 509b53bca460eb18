"""Push-mode agents that turn the files the trainer reads after they exit against it (issue 47 §A;
docs/threat_model.md, "Push-mode agents"). Under ``isolation="uid"`` the agent owns its work dir,
so before it exits it can put in place of its result file or of its stderr file

- a FIFO: a trainer that opens it by name blocks its event loop in ``open()``, every episode stops;
- a link to ``/dev/zero``: a read without end, MemoryError or the host's OOM killer;
- a link to a root-only file: its text would land in the episode's error, logs and trajectory;

or, where the host lets links in sticky dirs be followed (``fs.protected_symlinks=0``), swap the
work dir itself for a link to a root-only directory, whose ``result.json`` becomes its result.

Each agent does one of these and exits; the episode must end ``Failed`` / ``agent_error`` within a
bound (`anyio.fail_after`; a watchdog thread opens a FIFO's write end past it, so a trainer stuck
in ``open()`` fails the test instead of hanging the suite), in bounded memory (the test process
runs under an address-space limit while they play: an unbounded read is a MemoryError, not the
host's OOM killer), with no secret text anywhere in the result. Then the limits every push agent
runs under: memory, file size, processes, and (as root, where the machine has them) a cgroup.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import secrets
import shutil
import stat
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import anyio
import pytest

from arl.agents.process import PushModeRunner
from arl.sandbox.cgroups import cgroup_problem
from arl.sandbox.rlimits import SandboxLimits

pytestmark = pytest.mark.anyio

SYSTEM_PYTHON = "/usr/bin/python3"
ROOT = os.geteuid() == 0 and shutil.which("setpriv") is not None and os.path.exists(SYSTEM_PYTHON)
needs_root = pytest.mark.skipif(not ROOT, reason="isolation 'uid' needs root, setpriv and a system python "
                                                 "(/usr/bin/python3, which an unprivileged uid can run)")
BOUND_S = 20.0  # an episode whose agent exits at once ends within this
WATCHDOG_S = BOUND_S + 5  # then a trainer stuck on a FIFO is set free (and the test fails)
HEADROOM = 1 << 30  # address space the test process may grow by while an attack plays

AGENT = textwrap.dedent('''
    import json, os, sys
    attack, shared, target = sys.argv[1], sys.argv[2], os.environ.get("TARGET", "")
    result = os.environ["ARL_RESULT_PATH"]
    work = os.path.dirname(result)
    stderr = os.path.join(work, "stderr.txt")  # where the trainer kept the agent's stderr by name

    def replace(path, make):
        try:
            os.unlink(path)
        except OSError:
            pass
        make(path)

    with open(os.path.join(shared, attack + ".work"), "w") as f:
        f.write(work)  # for the watchdog: where the FIFOs are
    print("the agent's own stderr line", file=sys.stderr, flush=True)
    if attack == "fifo_result":
        replace(result, os.mkfifo)
    elif attack == "fifo_stderr":
        replace(stderr, os.mkfifo)
    elif attack == "zero_result":
        replace(result, lambda p: os.symlink("/dev/zero", p))
    elif attack == "zero_stderr":
        replace(stderr, lambda p: os.symlink("/dev/zero", p))
    elif attack == "secret_result":
        replace(result, lambda p: os.symlink(target, p))
    elif attack == "secret_stderr":
        replace(stderr, lambda p: os.symlink(target, p))
    elif attack == "swap_dir":  # the work dir becomes a link to a directory the agent cannot read
        try:
            os.rename(work, work + ".moved")
            os.symlink(target, work)
            print("swapped", file=sys.stderr)
        except OSError as exc:
            print(f"cannot swap: {exc}", file=sys.stderr)
        sys.exit(0)
    sys.exit(0 if attack.endswith("_result") else 1)
''')


class _Client:  # the HTTP client a runner is given; PushModeRunner only reads these two fields
    def __init__(self, token: str = "tok") -> None:
        self.base_url, self.api_key = "http://127.0.0.1:9/v1", token


@pytest.fixture
def setting():
    """The agent script in a dir others can read, a shared dir, and root-only secrets: a file,
    and a directory with a ``result.json`` of score 1.0 (another episode's, say)."""
    d = Path(tempfile.mkdtemp(prefix="arl-test-hostile-"))
    os.chmod(d, 0o755)
    (d / "agent.py").write_text(AGENT)
    os.chmod(d / "agent.py", 0o644)
    (d / "shared").mkdir()
    os.chmod(d / "shared", 0o1777)
    secret = f"ARL-SECRET-{secrets.token_hex(8)}"
    closed = Path(tempfile.mkdtemp(prefix="arl-test-secret-"))  # 0700, the trainer's
    (closed / "secret.txt").write_text(f"{secret}\n")
    (closed / "result.json").write_text(json.dumps({"score": 1.0, "success": True, "metrics": {"stolen": 1.0},
                                                    "error": secret}))
    for f in closed.iterdir():
        os.chmod(f, 0o600)
    yield {"dir": d, "secret": secret, "closed": closed}
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(closed, ignore_errors=True)


@pytest.fixture
def bounded_memory():
    """The test process (the trainer) may grow by `HEADROOM` of address space meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = vm + HEADROOM if hard == resource.RLIM_INFINITY else min(hard, vm + HEADROOM)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _free_fifos(shared: Path, attack: str) -> None:
    """Watchdog: open the write end of the agent's FIFOs, which frees a reader blocked in open()."""
    try:
        work = Path((shared / f"{attack}.work").read_text())
    except OSError:
        return
    for name in ("result.json", "stderr.txt"):
        try:
            if stat.S_ISFIFO(os.lstat(work / name).st_mode):
                os.close(os.open(work / name, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


async def _play(setting, attack: str, isolation: str, target: str = ""):
    d = setting["dir"]
    python = SYSTEM_PYTHON if isolation == "uid" else sys.executable
    runner = PushModeRunner(_Client(), [python, str(d / "agent.py"), attack, str(d / "shared")],
                            timeout_s=60, isolation=isolation, cwd=str(d), env_extra={"TARGET": target})
    assert runner.isolation == isolation
    watchdog = threading.Timer(WATCHDOG_S, _free_fifos, (d / "shared", attack))
    watchdog.start()
    start = time.monotonic()
    try:
        with anyio.fail_after(BOUND_S):
            result = await runner.run_job(1)
    finally:
        watchdog.cancel()
    assert time.monotonic() - start < BOUND_S
    return result


def _isolations():
    return [pytest.param("uid", marks=needs_root), "none"]


@pytest.mark.parametrize("isolation", _isolations())
@pytest.mark.parametrize("attack", ["fifo_result", "fifo_stderr", "zero_result", "zero_stderr"])
async def test_a_fifo_or_dev_zero_in_place_of_a_file_ends_the_episode_as_an_error(
        setting, bounded_memory, attack, isolation):
    result = await _play(setting, attack, isolation)
    assert (result.status, result.exit_reason) == ("Failed", "agent_error"), result.error
    assert len(result.error or "") < 10_000
    if attack.endswith("_result"):
        assert "result" in result.error
    assert "\0" not in (result.error or "")  # no /dev/zero bytes in the error


@needs_root
@pytest.mark.parametrize("attack", ["secret_result", "secret_stderr"])
async def test_a_link_to_a_root_only_file_shows_nothing_of_it(setting, bounded_memory, attack, caplog):
    with caplog.at_level(logging.DEBUG):
        result = await _play(setting, attack, "uid", str(setting["closed"] / "secret.txt"))
    assert (result.status, result.exit_reason) == ("Failed", "agent_error"), result.error
    assert setting["secret"] not in json.dumps(result.to_json())
    assert setting["secret"] not in caplog.text


@needs_root
async def test_swapping_the_work_dir_for_a_link_does_not_swap_the_result(setting, bounded_memory, caplog):
    """A directory that the agent may not read, with someone else's result.json in it: the agent
    replaces its work dir by a link to it. The trainer reads the result of the dir it made."""
    with caplog.at_level(logging.DEBUG):
        result = await _play(setting, "swap_dir", "uid", str(setting["closed"]))
    assert (result.status, result.exit_reason) == ("Failed", "agent_error"), result.error
    assert result.score != 1.0 and "stolen" not in (result.metrics or {})
    assert setting["secret"] not in json.dumps(result.to_json())
    assert setting["secret"] not in caplog.text
    assert (setting["closed"] / "result.json").exists()  # and the trainer removed nothing of it


# -- the limits a push agent runs under ------------------------------------------------------------

LIMITED = textwrap.dedent('''
    import json, os, sys, time
    what, result = sys.argv[1], os.environ["ARL_RESULT_PATH"]
    metrics = {}
    if what == "memory":
        # past the agent's address-space limit
        blob = bytearray(512 * 2**20)
    elif what == "file":
        with open(os.path.join(os.path.dirname(result), "big"), "wb") as f:
            # past its file-size limit: EFBIG (Python ignores SIGXFSZ)
            f.write(b"x" * (4 * 2**20))
    elif what == "procs":
        started = 0
        for _ in range(64):
            try:
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                started += 1
            except OSError:
                break
        metrics["started"] = float(started)
    elif what == "cgroup":
        with open("/proc/self/cgroup") as f:
            metrics["in_sandbox_cgroup"] = float("arl-sandbox-" in f.read())
    with open(result, "w") as f:
        json.dump({"score": 1.0, "success": True, "metrics": metrics}, f)
''')

SMALL = {"memory_bytes": 256 * 2**20, "file_size_bytes": 2**20, "max_procs": 8, "total_memory_bytes": 512 * 2**20}


async def _limited(setting, what: str, isolation: str = "uid", limits=SMALL):
    script = setting["dir"] / "limited.py"
    script.write_text(LIMITED)
    os.chmod(script, 0o644)
    python = SYSTEM_PYTHON if isolation == "uid" else sys.executable
    runner = PushModeRunner(_Client(), [python, str(script), what], timeout_s=60, isolation=isolation,
                            cwd=str(setting["dir"]), limits=limits)
    with anyio.fail_after(BOUND_S):
        return await runner.run_job(1)


@pytest.mark.parametrize("isolation", _isolations())
async def test_an_agent_past_its_memory_limit_fails(setting, isolation):
    result = await _limited(setting, "memory", isolation)
    assert (result.status, result.exit_reason) == ("Failed", "agent_error")
    assert result.error.rstrip().endswith("MemoryError"), result.error


@pytest.mark.parametrize("isolation", _isolations())
async def test_an_agent_past_its_file_size_limit_fails(setting, isolation):
    result = await _limited(setting, "file", isolation)
    assert (result.status, result.exit_reason) == ("Failed", "agent_error")
    assert result.error.rstrip().endswith(("File too large", "(SIGXFSZ: past its file-size limit)")), result.error


@needs_root
async def test_an_agent_cannot_start_more_processes_than_its_limit(setting):
    result = await _limited(setting, "procs")
    assert result.status == "Finished", result.error
    assert 1 <= result.metrics["started"] < 8


@needs_root
@pytest.mark.skipif(ROOT and cgroup_problem() is not None, reason=f"no cgroup here: {ROOT and cgroup_problem()}")
async def test_an_agent_runs_in_a_cgroup_of_its_own(setting):
    result = await _limited(setting, "cgroup")
    assert result.status == "Finished", result.error
    assert result.metrics["in_sandbox_cgroup"] == 1.0


async def test_limits_come_from_the_config_as_a_mapping_over_the_defaults():
    runner = PushModeRunner(_Client(), [sys.executable, "-c", "pass"], timeout_s=30, isolation="none",
                            limits={"memory_bytes": 2**30})
    assert runner.limits.memory_bytes == 2**30
    assert runner.limits.cpu_s == 30  # the default: CPU seconds = timeout_s
    assert PushModeRunner(_Client(), [sys.executable, "-c", "pass"], timeout_s=30, isolation="none",
                          limits=SandboxLimits(max_procs=5)).limits.max_procs == 5
    with pytest.raises(TypeError):
        PushModeRunner(_Client(), [sys.executable, "-c", "pass"], timeout_s=30, isolation="none",
                       limits={"no_such_limit": 1})


@pytest.mark.parametrize("isolation", _isolations())
@pytest.mark.parametrize(("script", "signal_name"), [
    ('exec head -c 4194304 /dev/zero > "$HOME/big"', "SIGXFSZ"),  # a program that does not ignore SIGXFSZ
    ("while :; do :; done", "SIGXCPU"),
])
async def test_a_program_killed_by_a_limit_says_which(setting, isolation, script, signal_name):
    runner = PushModeRunner(_Client(), ["/bin/sh", "-c", script], timeout_s=30, isolation=isolation,
                            cwd=str(setting["dir"]), limits={**SMALL, "cpu_s": 1})
    with anyio.fail_after(BOUND_S):
        result = await runner.run_job(1)
    assert (result.status, result.exit_reason) == ("Failed", "agent_error")
    assert f"({signal_name}: past its" in result.error, result.error
