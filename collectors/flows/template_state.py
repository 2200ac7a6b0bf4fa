"""Template state that outlives one file: per store, like nfcapd keeps it across rotations.

Collectors rotate their files every few minutes while exporters refresh their
IPFIX / NetFlow v9 templates (and options templates: sampling, time base) on
their own schedule, so most data files hold no template. ``rankscope ingest``
therefore keeps, per store and capture (the flow ``--job``, default ``fabric``),
in ``<store>/_flow_templates/job=<job>/state.json``:

- every template and options template, per (protocol, exporter address /
  observation domain or source id, template id);
- the per-exporter state options data set: sampling rates (also per
  selector) and ``systemInitTimeMilliseconds``;
- data sets that came before their template (at most ``MAX_HELD_BYTES`` per
  store, counted with their set headers); they decode when the template comes,
  in whichever later file or later ingest that is, and are stored with it.

A flow file's ingest loads the state, decodes, and stages the new state as
``staged-<manifest key>.json`` before its manifest entry is committed; the
staged state becomes ``state.json`` once the entry is committed. A crash in
between is resolved on the next load: a staged state whose entry was committed
is adopted, any other is dropped. So the state always matches the committed
files: a held data set is never decoded twice and never lost by a failed file.
Flow ingests into one store take ``_flow_templates/.lock`` from load to commit.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import fcntl
import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

# The decoders (flow_decoder, packet_columns and the four protocols) are imported by the two functions that
# build or fill a decoder: every ingest opens a session here (collectors/ingest/files.py), but only files with
# flows build a decoder; an OSDI'25 trace or a Kineto dump needs none (~5 ms CPU of a small analyze --ingest).

STATE_DIR = "_flow_templates"
STATE_FILE = "state.json"
LOCK_FILE = ".lock"
FORMAT_VERSION = 1
MAX_HELD_BYTES = 4 << 20
"""Data sets held for a template, per store (each costs flow_decoder.held_cost: payload, header, bookkeeping)."""
MAX_TEMPLATES = 20_000
"""Templates kept per store; the oldest go first (a broken exporter cannot grow the state without bound)."""

_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar("flow_template_session", default=None)


# ------------------------------------------------------------ (de)serialise
def export_state(dec) -> dict:
    """The decoder's cross-file state as JSON-ready data (exporters by name, not index)."""
    name = dec.exporters
    templates = [[proto, name[exp], tid, layout.scope_count, [[f.element, f.length] for f in layout.fields]]
                 for (proto, exp, tid), layout in dec.templates.items()][-MAX_TEMPLATES:]
    held = [[proto, name[exp], tid, base64.b64encode(body).decode(), export_s, base_ms]
            for (proto, exp, tid), sets in dec.waiting.items() for body, export_s, base_ms in sets]
    return {
        "version": FORMAT_VERSION,
        "templates": templates,
        "rates": [[name[e], r] for e, r in dec.rates.items()],
        "selector_rates": [[name[e], s, r] for (e, s), r in dec.selector_rates.items()],
        "system_init_ms": [[name[e], ms] for e, ms in dec.system_init_ms.items()],
        "held": held,
    }


def import_state(dec, state: dict) -> None:
    """Load :func:`export_state` output into a fresh decoder; malformed entries are skipped."""
    if not isinstance(state, dict) or state.get("version") != FORMAT_VERSION:
        return
    from rankscope.collectors.flows.flow_decoder import held_cost
    from rankscope.collectors.flows.packet_columns import Field, layout_for

    idx = dec.exporter_index
    for entry in _rows(state, "templates", 5):
        proto, exporter, tid, scope, fields = entry
        try:
            layout = layout_for([Field(int(e), int(n)) for e, n in fields], int(tid), int(scope))
        except (TypeError, ValueError):
            continue
        dec.templates[(str(proto), idx(str(exporter)), int(tid))] = layout
    for exporter, rate in _rows(state, "rates", 2):
        dec.rates[idx(str(exporter))] = int(rate)
    for exporter, sel, rate in _rows(state, "selector_rates", 3):
        dec.selector_rates[(idx(str(exporter)), int(sel))] = int(rate)
    for exporter, ms in _rows(state, "system_init_ms", 2):
        dec.system_init_ms[idx(str(exporter))] = int(ms)
    for proto, exporter, tid, b64, export_s, base_ms in _rows(state, "held", 6):
        try:
            body = base64.b64decode(b64, validate=True)
        except (ValueError, TypeError):
            continue
        key = (str(proto), idx(str(exporter)), int(tid))
        if dec.waiting_bytes + held_cost(body) > dec.max_waiting_bytes:
            break
        dec.waiting.setdefault(key, []).append((body, int(export_s), int(base_ms)))
        dec.waiting_bytes += held_cost(body)


def _rows(state: dict, key: str, width: int):
    rows = state.get(key)
    if not isinstance(rows, list):
        return
    for r in rows:
        if isinstance(r, list) and len(r) == width:
            yield r


# -------------------------------------------------------------- the session
class _Session:
    """One file's ingest: the store's state loaded under the lock, and what that file leaves."""

    def __init__(self, store, job: str):
        self.store = store
        self.dir = Path(store.root) / STATE_DIR / f"job={job}"
        self._lock_fd: int | None = None
        self.result: dict | None = None
        self.warnings: list[str] = []
        """what the ingest of this file should say: an unreadable state, data held for a missing template."""
        self.held_before = 0
        self.lost = False
        """the committed state was unreadable: templates this file's data needs may have been in it."""
        self.hold: str | None = None
        """why this file must not be committed (see :func:`hold_reason`)."""

    def load(self) -> dict:
        """The committed state (taking the lock first: held until the session ends)."""
        if self._lock_fd is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            self._recover()
        path = self.dir / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            # a state set aside as unreadable and not yet dealt with: its templates are still missing
            self.lost = self.lost or any(self.dir.glob(f"{STATE_FILE}.unreadable-*"))
            return {}
        except (OSError, ValueError) as e:
            state = e
        if isinstance(state, dict) and state.get("version") == FORMAT_VERSION:
            return state
        # Unreadable: said, and kept aside (the next commit would overwrite it), never silently reset.
        kept = path.with_name(f"{STATE_FILE}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
        with contextlib.suppress(OSError):
            os.replace(path, kept)
        why = str(state)[:120] if isinstance(state, Exception) else "not a state this version wrote"
        self.warnings.append(f"flow template state {path} is unreadable ({why}); decoding starts with no "
                             f"templates, and data that needs one is held, not stored (the file is kept as {kept.name})")
        self.lost = True
        return {}

    def _recover(self) -> None:
        for p in sorted(self.dir.glob("staged-*.json")):
            key = p.name[len("staged-"):-len(".json")]
            if self.store.has_source(key):
                os.replace(p, self.dir / STATE_FILE)
            else:
                p.unlink(missing_ok=True)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


@contextlib.contextmanager
def session(store, job: str | None = None) -> Iterator[None]:
    """Let flow importers inside this block share the template state of the store's capture ``job``."""
    s = _Session(store, job or "fabric")
    token = _SESSION.set(s)
    try:
        yield
    finally:
        _SESSION.reset(token)
        s.close()


def new_decoder():
    """A FlowDecoder primed with the store's state when inside :func:`session`, else a fresh one."""
    from rankscope.collectors.flows.flow_decoder import FlowDecoder

    dec = FlowDecoder(max_waiting_bytes=MAX_HELD_BYTES)
    s = _SESSION.get()
    if s is not None:
        import_state(dec, s.load())
        dec.hold_waiting = True
        s.held_before = _held_sets(dec)
    return dec


def _held_sets(dec) -> int:
    return sum(len(v) for v in dec.waiting.values())


def warnings() -> list[str]:
    """What the current session's file left to say (see :class:`_Session`)."""
    s = _SESSION.get()
    return list(s.warnings) if s is not None else []


def remember(dec) -> None:
    """Record the decoder's state at the end of its file, for :func:`stage`."""
    s = _SESSION.get()
    if s is not None and dec.hold_waiting:
        s.result = export_state(dec)
        held = _held_sets(dec)
        if held > s.held_before:
            ids = sorted({f"{proto} template {tid}" for proto, _, tid in dec.waiting})[:5]
            if s.lost:
                s.hold = (f"{held - s.held_before:,} data set(s) need {', '.join(ids)}, which the unreadable "
                          f"template state in {s.dir} may have held: the file is not marked ingested; ingest it "
                          "with a capture file that carries those templates, or remove the state.json.unreadable-* "
                          "file there to let its data wait for a later template")
            s.warnings.append(f"{held - s.held_before:,} data set(s) need a template no file has sent yet "
                              f"({', '.join(ids)}); their flows are not stored: they are held in "
                              f"{s.dir / STATE_FILE} and stored when a later file brings the template")


def hold_reason() -> str | None:
    """Why the current file must not be committed: its data waits for templates the lost state had."""
    s = _SESSION.get()
    return s.hold if s is not None else None


def stage(key: str) -> None:
    """Before the manifest entry ``key`` is committed: write the state it leaves, staged."""
    s = _SESSION.get()
    if s is None or s.result is None:
        return
    tmp = s.dir / f".staged-{key}.tmp"
    tmp.write_text(json.dumps(s.result, separators=(",", ":")))
    os.replace(tmp, s.dir / f"staged-{key}.json")


def promote(key: str) -> None:
    """After the manifest entry ``key`` is committed: its staged state becomes the state."""
    s = _SESSION.get()
    if s is None or s.result is None:
        return
    staged = s.dir / f"staged-{key}.json"
    if staged.exists():
        os.replace(staged, s.dir / STATE_FILE)
    s.result = None


# ------------------------------------------------------ the live collector
def load_for_collector(dec, store, job: str) -> None:
    """Prime a collector's decoder with the committed state of ``job`` (what earlier ingests and
    collector runs into this store learnt), and let it hold data past its last roll."""
    s = _Session(store, job)
    try:
        import_state(dec, s.load())
    finally:
        s.close()
    dec.hold_waiting = True


def save_for_collector(dec, store, job: str) -> None:
    """At a collector's last roll: its state becomes the committed state of ``job`` (under the lock;
    the collector's manifest entry is already written at every roll)."""
    s = _Session(store, job)
    try:
        s.load()
        tmp = s.dir / ".collector.tmp"
        tmp.write_text(json.dumps(export_state(dec), separators=(",", ":")))
        os.replace(tmp, s.dir / STATE_FILE)
    finally:
        s.close()


# ------------------------------------------------------------ capture order
def capture_time_s(path: Path) -> float | None:
    """When a flow capture starts: the first packet's time (pcap/pcapng) or export time (IPFIX file)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    if len(head) >= 24 + 8 and head[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        return float(struct.unpack_from("<I", head, 24)[0])
    if len(head) >= 24 + 8 and head[:4] in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        return float(struct.unpack_from(">I", head, 24)[0])
    if len(head) >= 16 and head[:2] == b"\x00\x0a":
        return float(struct.unpack_from(">I", head, 4)[0])
    if head[:4] == b"\x0a\x0d\x0d\x0a":
        return _pcapng_first_time(path)
    return None


def _pcapng_first_time(path: Path) -> float | None:
    import dpkt

    try:
        with open(path, "rb") as f:
            for ts, _ in dpkt.pcapng.Reader(f):
                return float(ts)
    except (ValueError, dpkt.UnpackError, struct.error, OSError):
        return None
    return None


def capture_order(paths: list[Path]) -> list[Path]:
    """Flow captures in capture-time order, in the slots they held; every other file stays put."""
    times = {i: t for i, p in enumerate(paths) if (t := capture_time_s(p)) is not None}
    slots = sorted(times)
    ordered = sorted(slots, key=lambda i: (times[i], str(paths[i])))
    out = list(paths)
    for slot, i in zip(slots, ordered):
        out[slot] = paths[i]
    return out
