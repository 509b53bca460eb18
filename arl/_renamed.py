"""Old names that still work after a rename (docs/architecture.md, "Glossary": one word per concept).

Every use of an old name warns with a DeprecationWarning that names the new one:

- `renamed_keywords`: a function's old keyword arguments, e.g. ``Sample.of(state_hash=...)``;
- `renamed_fields`: an attrs class's old field names, as ``__init__`` keywords and as read-only
  attributes, e.g. ``Turn(state_hash=...)`` and ``turn.state_hash``;
- `old_names`: a module's old names, renamed in it or moved to another module, as its module
  ``__getattr__`` (PEP 562), e.g. ``arl.agents.STATE_KEY`` and ``from arl.rollout import
  ManagerConfig`` (now `arl.config`).

Imports nothing of arl (`old_names` imports a moved name's new module when the old name is used):
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


Target = str | tuple[str, Callable[[], Any]]


def old_names(module: str, namespace: dict[str, Any], **olds: Target) -> Callable[[str], Any]:
    """The module ``__getattr__`` (PEP 562) of a module whose public names were renamed or moved:
    each old name of ``olds`` still gives its object, with a DeprecationWarning naming what to use;
    any other name raises AttributeError. A target is

    - ``"NEW"``: renamed in this module, the object ``namespace["NEW"]`` (the module's ``globals()``);
    - ``"pkg.mod:NEW"``: moved, imported from there when first asked for (so the old module does not
      load the new one's dependencies until then);
    - ``(advice, get)``: no one-to-one replacement: ``get()`` builds the old object, and the warning
      says ``advice``.

    >>> __getattr__ = old_names("mod", {"NEW": 1}, OLD="NEW", dumps="json:dumps", LIST=("list()", lambda: []))
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     __getattr__("OLD"), __getattr__("dumps")([1]), __getattr__("LIST")
    ...     [str(w.message) for w in caught]
    (1, '[1]', [])
    ['mod.OLD is deprecated: use mod.NEW', 'mod.dumps is deprecated: use json.dumps', 'mod.LIST is deprecated: use list()']
    """
    def __getattr__(name: str) -> Any:
        target = olds.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        if isinstance(target, tuple):
            advice, get = target
            warn_renamed(f"{module}.{name}", advice)
            return get()
        where, _, new = target.rpartition(":")
        warn_renamed(f"{module}.{name}", f"{where or module}.{new}")
        return getattr(importlib.import_module(where), new) if where else namespace[new]

    return __getattr__
