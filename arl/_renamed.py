"""Old names that still work after a rename (docs/architecture.md, "Glossary": one word per concept).

Every use of an old name warns with a DeprecationWarning that names the new one:

- `renamed_keywords`: a function's old keyword arguments, e.g. ``Sample.of(state_hash=...)``;
- `renamed_fields`: an attrs class's old field names, as ``__init__`` keywords and as read-only
  attributes, e.g. ``Turn(state_hash=...)`` and ``turn.state_hash``;
- `renamed_constants`: a module's old constant names, as its module ``__getattr__`` (PEP 562);
- `moved_names`: names that moved to another module, as the old module's ``__getattr__``, e.g.
  ``from arl.rollout import ManagerConfig`` (now `arl.config`).

Imports nothing of arl (`moved_names` imports the new module by name when an old name is used):
any module may use it (`arl.algo`, which imports nothing of arl but
itself, has its own copy of `renamed_keywords` in `arl.algo._groups`).
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


def warn_renamed(old: str, new: str, stacklevel: int = 2) -> None:
    """Warn that ``old`` is deprecated and ``new`` is its name now (``stacklevel`` as in `warnings.warn`,
    counted from the caller of this function)."""
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=stacklevel + 1)


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # an array's == is elementwise (no single truth value): not provably the same
        return False


def renamed_keywords(where: str | None = None, **renames: str) -> Callable[[F], F]:
    """Decorate a function so that each old keyword ``old=new`` of ``renames`` is still accepted:
    it warns and is passed on as the new one. Given with its new name, it must carry the same value
    (code written before a duplicate field was removed passes both), else TypeError. ``where``
    names the function in the warning (default: its qualified name).

    >>> @renamed_keywords(state_hashes="state_keys")
    ... def anchors(state_keys):
    ...     return state_keys
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     anchors(state_hashes=["s0"]), str(caught[0].message)
    (['s0'], 'anchors(state_hashes=...) is deprecated: use anchors(state_keys=...)')
    """
    def decorate(fn: F) -> F:
        name = where or fn.__qualname__

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    value = kwargs.pop(old)
                    warn_renamed(f"{name}({old}=...)", f"{name}({new}=...)")
                    if new in kwargs and not _same(kwargs[new], value):
                        raise TypeError(f"{name}() got {old}={value!r} and {new}={kwargs[new]!r}: {old} is the "
                                        f"old name of {new}; give only {new}")
                    kwargs[new] = value
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_fields(**renames: str) -> Callable[[C], C]:
    """Class decorator (above ``@attrs.define``) for the fields renamed ``old=new``: ``cls(old=...)``
    passes ``new=...`` and ``instance.old`` reads ``instance.new`` (read-only), each with a
    DeprecationWarning. (attrs' ``field(alias=...)`` renames the keyword instead of adding one.)

    >>> import attrs
    >>> @renamed_fields(state="observation")
    ... @attrs.frozen
    ... class Report:
    ...     observation: str
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     report = Report(state="P_G")
    ...     report.observation, report.state, [str(w.message) for w in caught]
    ('P_G', 'P_G', ['Report(state=...) is deprecated: use Report(observation=...)', 'Report.state is deprecated: use Report.observation'])
    """
    def decorate(cls: C) -> C:
        cls.__init__ = renamed_keywords(cls.__name__, **renames)(cls.__init__)  # type: ignore[misc]
        for old, new in renames.items():
            setattr(cls, old, _old_attribute(cls.__name__, old, new))
        return cls

    return decorate


def _old_attribute(owner: str, old: str, new: str) -> property:
    def read(self: Any) -> Any:
        warn_renamed(f"{owner}.{old}", f"{owner}.{new}")
        return getattr(self, new)

    return property(read, doc=f"Deprecated: the old name of ``{new}``.")


def renamed_constants(module: str, namespace: dict[str, Any], **renames: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that gives each old constant name ``old=new`` the value of ``new``
    in ``namespace`` (the module's ``globals()``), with a DeprecationWarning; other names raise
    AttributeError.

    >>> __getattr__ = renamed_constants("mod", {"NEW": 1}, OLD="NEW")
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     __getattr__("OLD"), str(caught[0].message)
    (1, 'mod.OLD is deprecated: use mod.NEW')
    """
    def __getattr__(name: str) -> Any:
        if name in renames:
            warn_renamed(f"{module}.{name}", f"{module}.{renames[name]}")
            return namespace[renames[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def moved_names(module: str, new_module: str, *names: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for public names that moved to ``new_module`` under the same name:
    each of ``names`` is imported from there (on first use, so the old module does not load the new
    one's dependencies until asked) with a DeprecationWarning naming the new place; other names raise
    AttributeError. docs/architecture.md §10: a moved public name imports from its old place for
    one release.

    >>> __getattr__ = moved_names("old", "json", "dumps")
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     __getattr__("dumps")([1]), str(caught[0].message)
    ('[1]', 'old.dumps is deprecated: use json.dumps')
    """
    moved = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in moved:
            warn_renamed(f"{module}.{name}", f"{new_module}.{name}")
            return getattr(importlib.import_module(new_module), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
