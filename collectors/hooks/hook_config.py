"""The live hook's configuration: one frozen dataclass, readable from the environment.

``rankscope attach`` passes its options to the rank processes through
``RANKSCOPE_HOOK_*`` environment variables; :func:`HookConfig.from_env` reads
them back. Importing this module pulls in no torch, polars or pyarrow.
"""

from __future__ import annotations

import os
import re
from dataclasses import fields

from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record

ENV_PREFIX = "RANKSCOPE_HOOK_"
ENV_SWITCH = "RANKSCOPE_HOOK"
"""``1`` activates the bootstrap in any process, ``0`` never; unset: only in torch.distributed ranks."""

JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
"""The store's rule for job names (store.check_job_name), repeated here so that starting the
hook in a rank does not import pyarrow on the job's thread; a unit test keeps the two equal."""

ROW_COST_BYTES = 256
"""Memory one buffered row costs (a tuple of ~15 small Python objects), for turning
the byte cap into a row count without measuring every row on the hot path."""


@record
class HookConfig:
    """How the hook records and writes. Environment: ``RANKSCOPE_HOOK_<FIELD>`` (upper case)."""

    store: str
    """Trace store directory the rank processes write into."""
    job: str = "default"
    """Job name the records are stored under."""
    flush_interval_s: float = 5.0
    """The background writer writes a new part at least this often (a live dashboard sees fresh data)."""
    buffer_bytes: int = 64 << 20
    """Memory cap of one rank's record buffer; when full, the oldest rows are dropped and counted."""
    hang_timeout_s: float = 300.0
    """A call not completed after this long makes the watchdog dump the rank's pending ops."""
    watchdog: bool = True
    """Run the hang watchdog thread."""
    auto_step: bool = True
    """Mark steps from ``optimizer.step`` when the job never calls :func:`step` itself."""
    cupti: bool = True
    """Collect GPU kernels with CUPTI when a CUDA device and ``cupti-python`` are present."""
    signals: bool = True
    """Flush on SIGTERM/SIGINT (then chain to the job's own handler)."""

    def __post_init__(self):
        if not isinstance(self.store, str) or not self.store:
            raise ConfigError(f"store {self.store!r}: expected a directory path")
        # Ranks may change directory; the store must not move with them.
        object.__setattr__(self, "store", os.path.abspath(self.store))
        if not (0.01 <= self.flush_interval_s <= 86400):
            raise ConfigError(f"flush_interval_s {self.flush_interval_s!r}: expected 0.01 .. 86400 seconds")
        if not (ROW_COST_BYTES * 4 <= self.buffer_bytes <= 1 << 40):
            raise ConfigError(f"buffer_bytes {self.buffer_bytes!r}: expected {ROW_COST_BYTES * 4} .. 2**40")
        if not (0.01 <= self.hang_timeout_s <= 7 * 86400):
            raise ConfigError(f"hang_timeout_s {self.hang_timeout_s!r}: expected 0.01 .. 604800 seconds")
        if not isinstance(self.job, str) or not JOB_NAME_RE.match(self.job):
            raise ConfigError(f"job name {self.job!r} is not allowed; expected 1-128 of letters, digits and _.:+-")

    @property
    def buffer_rows(self) -> int:
        """The buffer's capacity in rows."""
        return max(4, self.buffer_bytes // ROW_COST_BYTES)

    @classmethod
    def from_env(cls, environ=None, **overrides) -> HookConfig:
        """Build from ``RANKSCOPE_HOOK_*`` variables; ``overrides`` win over the environment."""
        env = os.environ if environ is None else environ
        overrides = {k: v for k, v in overrides.items() if v is not None}
        kw = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or f.name in overrides:
                continue
            kw[f.name] = _parse(f.name, raw, f.type)
        kw.update(overrides)
        if "store" not in kw:
            raise ConfigError(f"no store given: pass store=... or set {ENV_PREFIX}STORE")
        return cls(**kw)

    def to_env(self) -> dict[str, str]:
        """The variables that make :func:`from_env` rebuild this config in a child process."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[ENV_PREFIX + f.name.upper()] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out


def _parse(name: str, raw: str, typ) -> object:
    typ = str(typ)
    try:
        if typ == "bool":
            if raw.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if raw.strip().lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if typ == "int":
            return int(float(raw))
        if typ == "float":
            return float(raw)
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r}: expected a {typ}") from None
    return raw
