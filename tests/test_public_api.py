"""The public API stays put (issue 47 §E; docs/architecture.md §10, "The public API").

Public are the top-level facade (``from arl import X``: `arl.__all__`), each package's ``__all__``
(`PACKAGES`) and that of `arl.config` (`MODULES`: the one top-level module with public names, the
config records), plus what the docs import in their code blocks. This test holds them to it:

- every public name imports from where it is public without any warning;
- each ``__all__`` names only existing names, once each;
- every package of arl either has an ``__all__`` (`PACKAGES`) or is listed with the reason it has
  none (`WITHOUT_ALL`), so a new package declares its public names when it is added;
- each name that moved (`MOVED`) or was renamed (`RENAMED`) still imports from its old place, with
  a DeprecationWarning that names the new place, and is the very object of the new place. When a
  shim is dropped after its release, its row goes too.
"""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import arl

ROOT = Path(__file__).resolve().parents[1]

# The packages whose __all__ is their public API.
PACKAGES = (
    "arl.agents", "arl.algo", "arl.engine", "arl.envs", "arl.envs.bugfix", "arl.envs.realbugs", "arl.intercept", "arl.models",
    "arl.plan", "arl.rollout", "arl.sandbox", "arl.train", "arl.viz",
)

# The top-level modules whose __all__ is public.
MODULES = ("arl.config",)

# The packages without an __all__, and why.
WITHOUT_ALL = {
    "arl.agents.examples": "example agent programs, run as `python -m arl.agents.examples.<name>`, not imported",
    "arl.integrations": "a namespace for the bridges to other frameworks; holds no names",
    "arl.integrations.verl": "an optional extra (verl); its entry points are the ones docs/verl.md names",
    "arl.integrations.verl.cpu": "an optional extra (verl), loaded by verl through VERL_USE_EXTERNAL_MODULES",
}

# (old module, name, new module): public names that moved to another module under the same name.
SANDBOX_NAMES = ("COMMAND_STATUSES", "ISOLATIONS", "SANDBOX_CWD", "CommandResult", "Sandbox", "SandboxLimits",
                 "SandboxUnavailable", "bwrap_problem", "limits_prefix", "python_paths")
MOVED = [
    # every config record went to arl.config (a9f4f0c, 2026-12-03)
    ("arl.rollout", "ManagerConfig", "arl.config"),
    ("arl.engine", "EngineConfig", "arl.config"),
    ("arl.engine", "BACKENDS", "arl.config"),
    # the sandbox left envs for a package of its own (b0ccca5, 2026-12-04)
    *(("arl.envs.sandbox", name, "arl.sandbox") for name in SANDBOX_NAMES),
]

# (module, old name, new name): public names renamed in their package (issue 44 §1).
RENAMED = [
    ("arl.rollout", "Branch", "ForkBranch"),
    ("arl.agents", "STATE_KEY", "OBSERVATION_INFO_KEY"),
    ("arl.agents", "GAME_STATE_KEY", "STATE_KEY_INFO_KEY"),
]


def import_name(module: str, name: str) -> object:
    """``from module import name``, as a user writes it (a package's fromlist check included)."""
    namespace: dict[str, object] = {}
    exec(f"from {module} import {name} as value", namespace)
    return namespace["value"]


def public_all(package: str) -> list[str]:
    return list(importlib.import_module(package).__all__)


def docs_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) for each ``from arl... import name`` in a fenced code block of README.md
    and docs/*.md (each name of a parenthesised import too)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"^\s*```[^\n]*\n(.*?)^\s*```", path.read_text(), re.M | re.S):
            for module, names in re.findall(r"^\s*(?:>>>\s*)?from\s+(arl(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#]+)",
                                            block, re.M):
                for item in names.strip("() \n").split(","):
                    if item.strip():
                        found.append((str(path.relative_to(ROOT)), module, item.split(" as ")[0].strip()))
    return found


def test_the_facade_names_import_without_a_warning():
    assert len(arl.__all__) == len(set(arl.__all__)), "arl.__all__ names a name twice"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in arl.__all__:
            assert import_name("arl", name) is getattr(arl, name)
        exec("from arl import *", {})


@pytest.mark.parametrize("package", PACKAGES + MODULES)
def test_a_package_all_imports_without_a_warning(package):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = importlib.import_module(package)
        names = public_all(package)
        assert names and all(isinstance(n, str) for n in names)
        duplicates = sorted({n for n in names if names.count(n) > 1})
        assert not duplicates, f"{package}.__all__ names {duplicates} twice"
        missing = [n for n in names if not hasattr(module, n)]
        assert not missing, f"{package}.__all__ names {missing}, which {package} does not have"
        for name in names:
            import_name(package, name)
        exec(f"from {package} import *", {})


def test_every_package_declares_its_public_names_or_says_why_not():
    packages = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "arl").rglob("__init__.py") if "__pycache__" not in init.parts
    } - {"arl"}
    assert packages == set(PACKAGES) | set(WITHOUT_ALL), (
        "a package of arl is in neither PACKAGES (it has an __all__) nor WITHOUT_ALL (with the reason)")
    for package in PACKAGES:
        source = (ROOT / Path(*package.split(".")) / "__init__.py").read_text()
        assert re.search(r"^__all__\b", source, re.M), f"{package} has no __all__"


def test_the_names_the_docs_import_import_without_a_warning():
    cited = docs_imports()
    assert ("README.md", "arl", "Trainer") in cited  # the parser reads the docs' code blocks
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for where, module, name in cited:
            try:
                import_name(module, name)
            except Exception as error:  # noqa: BLE001 - say which citation
                pytest.fail(f"{where}: from {module} import {name}: {error!r}")


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_a_moved_name_imports_from_its_old_place_with_a_warning(old, name, new):
    assert name in public_all(new), f"{new}.{name} is where {old}.{name} went, so it is public there"
    assert name not in getattr(importlib.import_module(old), "__all__", ())
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old}.{name} is deprecated: use {new}.{name}")):
        value = import_name(old, name)
    assert value is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize(("module", "old", "new"), RENAMED, ids=[f"{m}.{o}" for m, o, _ in RENAMED])
def test_a_renamed_name_imports_under_its_old_name_with_a_warning(module, old, new):
    assert new in public_all(module) and old not in public_all(module)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{module}.{old} is deprecated: use {module}.{new}")):
        value = import_name(module, old)
    assert value is getattr(importlib.import_module(module), new)


def test_an_unknown_name_is_still_an_attribute_error():
    for module in ("arl", "arl.rollout", "arl.engine", "arl.envs.sandbox", "arl.agents"):
        with pytest.raises(ImportError):
            import_name(module, "NoSuchName")
