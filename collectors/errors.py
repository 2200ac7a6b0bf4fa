"""The one error hierarchy of rankscope.

Every error a user can cause derives from :class:`RankscopeError`; its message
names the bad value and what was expected. The CLI maps :class:`UsageError`
(and its subclasses) to exit code 2 and every other :class:`RankscopeError` to 1.
"""

from __future__ import annotations


class RankscopeError(Exception):
    """Root of every error rankscope raises on purpose."""


class UsageError(RankscopeError, ValueError):
    """A bad option, flag or configuration value (CLI exit code 2)."""


class ConfigError(UsageError):
    """A configuration dataclass got a value outside its documented range."""


class SchemaError(RankscopeError):
    """A table does not fit a record kind (unknown kind, missing required column)."""


class StoreError(RankscopeError):
    """The trace store could not be read or written."""


class InputFormatError(RankscopeError):
    """A file or record could not be decoded.

    Carries the file, the record (index, offset or key) and what was expected,
    so the message alone tells the user where to look.
    """

    def __init__(self, path: object, record: object | None, expected: str, got: object | None = None):
        self.path = str(path) if path is not None else None
        self.record = record
        self.expected = expected
        self.got = got
        where = self.path or "<input>"
        if record is not None:
            where += f", record {record}"
        msg = f"{where}: expected {expected}"
        if got is not None:
            text = repr(got)
            msg += f", got {text[:120] + '...' if len(text) > 120 else text}"
        super().__init__(msg)

    @property
    def reason(self) -> str:
        """Short reason key used when counting rejects."""
        return f"expected {self.expected}"


class UnsafePickleError(InputFormatError):
    """A pickle tried to build something other than plain containers and scalars."""
