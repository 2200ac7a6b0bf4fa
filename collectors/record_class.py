"""``record``: a dataclass whose class statement generates one method, not up to six.

On Python 3.11, ``dataclasses.dataclass`` compiles every method it adds with its own ``exec``: ``__init__``,
``__repr__``, ``__eq__`` and, for a frozen class, ``__setattr__``, ``__delattr__`` and ``__hash__``. With
110 such classes loaded by ``rankscope analyze``, that was half of the time rankscope's own modules took to
import (0.09-0.18 s of 0.18-0.35 s, measured on this 2-core machine under load), paid by every command.
``record`` lets ``dataclass`` generate ``__init__`` only and gives every class the same ``__eq__``,
``__hash__``, ``__repr__`` and, when frozen, ``__setattr__``/``__delattr__``, written once below. The
classes behave as ``dataclass`` (``frozen=True`` by default) made them: fields, defaults, ``replace``,
``fields``, ``asdict`` and ``is_dataclass`` are the stdlib's; equality and hashing compare the fields
``compare``/``hash`` select, in order; assigning or deleting an attribute of a frozen record raises
``dataclasses.FrozenInstanceError``.

One difference: ``__init__`` sets fields by plain assignment, which a frozen record allows only for a field
not yet set. So ``__post_init__`` may set a field that ``init=False`` left unset, as with
``object.__setattr__`` on a frozen dataclass.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from typing import TypeVar, overload

T = TypeVar("T", bound=type)


def _values(self, names: tuple[str, ...]) -> tuple:
    return tuple([getattr(self, n) for n in names])


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self.__class__.__record_compare__
    return _values(self, names) == _values(other, names)


def _hash(self) -> int:
    return hash(_values(self, self.__class__.__record_hash__))


@reprlib.recursive_repr()
def _repr(self) -> str:
    shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__class__.__record_repr__)
    return f"{self.__class__.__qualname__}({shown})"


def _frozen_setattr(self, name: str, value) -> None:
    # __init__ assigns each field once; any other assignment is refused, as on a frozen dataclass
    if name in self.__dict__ or name not in self.__class__.__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _frozen_delattr(self, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _init_on_first_call(owner: type) -> Callable:
    """An ``__init__`` that makes ``owner``'s dataclass ``__init__`` when first called, puts it in its place
    and runs it: half of the record classes ``rankscope analyze`` loads are never instantiated in a run (58 of
    116 on the OSDI'25 traces), and compiling theirs took 8-10 ms of ST's 0.5 s (paired medians of 21 runs).

    The real one is dataclass' own, made on a subclass that adds nothing (so its fields, defaults,
    factories and ``__post_init__`` are ``owner``'s); two threads that both make it put equivalent ones."""

    def __init__(self, *args, **kwargs):
        shadow = dataclasses.dataclass(
            type(owner.__name__, (owner,), {"__module__": owner.__module__, "__qualname__": owner.__qualname__,
                                           "__doc__": owner.__doc__}), eq=False, repr=False)
        init = shadow.__dict__["__init__"]
        owner.__init__ = init
        init(self, *args, **kwargs)

    __init__.__qualname__ = f"{owner.__qualname__}.__init__"
    return __init__


def _make(cls: T, frozen: bool) -> T:
    own = cls.__dict__
    for name in ("__setattr__", "__delattr__") if frozen else ():
        if name in own:
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    # as dataclass: a __hash__ of the class body counts unless Python set it to None for its own __eq__
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    # a class without a docstring gets dataclass' own (its __init__ signature): its __init__ is made now
    lazy_init = "__init__" not in own and own.get("__doc__") is not None
    cls = dataclasses.dataclass(cls, init=not lazy_init, eq=False, repr=False)
    if lazy_init:
        cls.__init__ = _init_on_first_call(cls)
    fields = dataclasses.fields(cls)
    cls.__record_compare__ = tuple(f.name for f in fields if f.compare)
    cls.__record_hash__ = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
    cls.__record_repr__ = tuple(f.name for f in fields if f.repr)
    if "__eq__" not in own:
        cls.__eq__ = _eq
    if "__repr__" not in own:
        cls.__repr__ = _repr
    if frozen:
        cls.__setattr__, cls.__delattr__ = _frozen_setattr, _frozen_delattr
    if not explicit_hash:
        # as dataclass: eq and frozen hash the fields; eq alone makes instances unhashable
        cls.__hash__ = _hash if frozen else None
    return cls


@overload
def record(cls: T, /) -> T: ...
@overload
def record(*, frozen: bool = True) -> Callable[[T], T]: ...


def record(cls=None, /, *, frozen: bool = True):
    """``@record`` is ``@dataclass(frozen=True)``; ``@record(frozen=False)`` is ``@dataclass``."""
    if cls is None:
        return lambda c: _make(c, frozen)
    return _make(cls, frozen)
