"""The pinned packages of ``arl/RealBugFix-v0`` and their offline cache.

    root = ensure_package(PACKAGES["inflection"])   # $ARL_HOME/realbugs/inflection-0.5.1: the sdist, unpacked

Each package is a small pure-Python project from PyPI whose sdist ships its own test suite
(run by plain pytest, no network, no compiled code). The sdist is fetched once by
``pip download`` at an exact version, checked against its sha256 and unpacked under
``$ARL_HOME/realbugs`` (``ARL_HOME`` as the model zoo reads it, default ``~/.cache/arl``); after
that everything is offline. A fetch that fails says so (`PackageUnavailable`) with the command to
run where PyPI is reachable.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import attrs

from arl.config import arl_home


class PackageUnavailable(RuntimeError):
    """A pinned sdist is not in the cache and could not be fetched (offline, or a hash mismatch)."""


@attrs.frozen
class Package:
    """A pinned sdist: ``sources`` are the files bugs are put in; ``tests`` what pytest runs."""

    name: str
    version: str
    sha256: str
    sources: tuple[str, ...]
    tests: tuple[str, ...]

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


PACKAGES: dict[str, Package] = {
    package.name: package for package in (
        Package("inflection", "0.5.1", "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417",
                sources=("inflection/__init__.py",), tests=("test_inflection.py",)),
        Package("more-itertools", "10.5.0", "5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6",
                sources=("more_itertools/recipes.py",), tests=("tests",)),
        Package("toolz", "1.0.0", "2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02",
                sources=("toolz/itertoolz.py", "toolz/dicttoolz.py"), tests=("toolz/tests",)),
    )
}


def cache_dir() -> Path:
    """``$ARL_HOME/realbugs`` (``ARL_HOME`` defaults to ``~/.cache/arl``, as for the model zoo)."""
    return arl_home() / "realbugs"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ensure_package(package: Package, *, fetch: bool = True) -> Path:
    """The unpacked sdist of ``package`` in the cache (fetched and checked first if missing)."""
    root = cache_dir() / package.dirname
    if (root / ".arl-verified").exists():
        return root
    archive = cache_dir() / f"{package.dirname}.tar.gz"
    if not archive.exists():
        if not fetch:
            raise PackageUnavailable(f"{package.requirement} is not in {cache_dir()}; run "
                                     "`python -m arl.envs.realbugs.build` where PyPI is reachable")
        _download(package, archive)
    if (digest := sha256_of(archive)) != package.sha256:
        archive.unlink()
        raise PackageUnavailable(f"{archive.name}: sha256 {digest}, pinned {package.sha256}")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        unpacked = Path(tmp) / package.dirname
        if not unpacked.is_dir():
            raise PackageUnavailable(f"{archive.name} does not unpack to {package.dirname}/")
        (unpacked / ".arl-verified").write_text(package.sha256 + "\n")
        shutil.rmtree(root, ignore_errors=True)
        unpacked.rename(root)
    return root


def _download(package: Package, archive: Path) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--disable-pip-version-check", "-d", tmp, package.requirement]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        found = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or len(found) != 1:
            raise PackageUnavailable(f"could not fetch {package.requirement} (PyPI unreachable?): "
                                     f"{' '.join(command)} -> rc {done.returncode}: {done.stderr.strip()[-400:]}")
        found[0].rename(archive)


def package_files(root: Path) -> dict[str, bytes]:
    """Every regular file of an unpacked sdist (relative path -> bytes), the cache marker and
    build metadata (``*.egg-info``) left out: what the agent's repository and the judge start from."""
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if (not path.is_file() or path.is_symlink() or relative == ".arl-verified"
                or ".egg-info" in relative or "__pycache__" in relative):
            continue
        files[relative] = path.read_bytes()
    return files


__all__ = ["PACKAGES", "Package", "PackageUnavailable", "cache_dir", "ensure_package", "package_files", "sha256_of"]
