"""A restricted unpickler for dumps that come from other machines.

Only plain containers (dict, list, tuple, set, frozenset) and scalars (None,
bool, int, float, str, bytes) are built. Every attempt to look up a global
(a class, a function, ``os.system`` through ``__reduce__``) or to load a
persistent id is refused with :class:`UnsafePickleError` before anything runs:
the pickle machine only calls code it obtained through ``find_class``.

A truncated pickle keeps what was fully built before the cut: the pure-Python
unpickler's stacks hold the finished objects, and :func:`loads` hands them back
so the caller can salvage complete records.
"""

from __future__ import annotations

import io
import pickle
import struct

from rankscope.collectors.errors import InputFormatError, UnsafePickleError
from rankscope.collectors.importers.contract import LIMITS

_ALLOWED = {("builtins", "set"), ("builtins", "frozenset"), ("__builtin__", "set"),
            ("__builtin__", "frozenset"),
            # protocol 2 spells bytes as _codecs.encode(str, 'latin1'): data in, data out
            ("_codecs", "encode")}


MAX_DEPTH = 100
"""Containers nested deeper than this are refused (real dumps nest about 6 deep)."""


class _Restricted(pickle._Unpickler):  # the pure-Python one: its stacks survive a truncated stream
    def __init__(self, f, path, max_references: int):
        super().__init__(f)
        self._path = path
        self._refs_left = max_references
        self._max_refs = max_references
        self.dispatch = dict(pickle._Unpickler.dispatch)
        for op in (pickle.GET[0], pickle.BINGET[0], pickle.LONG_BINGET[0]):
            self.dispatch[op] = self._counting(pickle._Unpickler.dispatch[op])
        self.dispatch[pickle.MARK[0]] = self._mark

    def _counting(self, load):
        """A memo fetch that counts containers: one entry referenced 400,001 times is a bomb."""
        def f(self_):
            load(self_)
            if isinstance(self_.stack[-1], (dict, list, set, tuple, frozenset, bytearray)):
                self_._refs_left -= 1
                if self_._refs_left < 0:
                    raise UnsafePickleError(self_._path, "memo", f"at most {self_._max_refs:,} repeated references "
                                            "to one container", got="more (a reference bomb)")
        return f

    @staticmethod
    def _mark(self_):
        if len(self_.metastack) >= MAX_DEPTH:
            raise InputFormatError(self_._path, "MARK", f"containers nested at most {MAX_DEPTH} deep",
                                   got="deeper")
        pickle._Unpickler.load_mark(self_)

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise UnsafePickleError(self._path, f"global {module}.{name}",
                                "only plain containers and scalars in the pickle",
                                got=f"{module}.{name}")

    def persistent_load(self, pid):
        raise UnsafePickleError(self._path, "persistent id", "only plain containers and scalars in the pickle",
                                got=repr(pid)[:60])


def loads(data: bytes, path: object = None) -> tuple[object, list | None]:
    """(object, None) for a complete pickle; (None, partial objects) for one cut short.

    Raises UnsafePickleError for anything but plain data and InputFormatError
    when the bytes are not a pickle at all.
    """
    if not data:
        raise InputFormatError(path, None, "a pickle", got="empty file")
    u = _Restricted(io.BytesIO(data), path, LIMITS.get().max_references)
    try:
        return u.load(), None
    except UnsafePickleError:
        raise
    except InputFormatError:
        raise
    except EOFError:
        pass
    except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            UnicodeDecodeError, OverflowError, struct.error, MemoryError, RecursionError) as e:
        # A stream that breaks off mid-opcode also lands here; keep what was built if anything.
        parts = _partial(u)
        if not parts:
            raise InputFormatError(path, None, "a readable pickle", got=f"{type(e).__name__}: {e}") from None
        return None, parts
    return None, _partial(u)


def _partial(u: _Restricted) -> list:
    out = []
    for frame in [*getattr(u, "metastack", []), getattr(u, "stack", [])]:
        out.extend(frame)
    return out
