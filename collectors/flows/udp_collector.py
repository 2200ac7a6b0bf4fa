"""The live flow collector: UDP datagrams from switches into the trace store.

Listens on one or several UDP ports (IPFIX, NetFlow v9/v5 and sFlow may share
a port: each datagram's protocol is detected), decodes with one
:class:`FlowDecoder`, and rolls what it decoded into new Parquet parts every
``roll_seconds`` or ``roll_records``, whichever comes first, so a dashboard
sees fresh data and memory stays bounded by configuration. A malformed
datagram is counted by reason (a few kept as hex samples) and never stops the
collector. On SIGTERM/SIGINT (or a stop event, or ``max_seconds``) it stops
reading new data only after draining what the kernel already queued, then
writes everything decoded: nothing received is lost. The socket receive
buffer is sized (``SO_RCVBUFFORCE`` as root, else ``SO_RCVBUF``) and the
kernel's drop count for each socket is read back from ``/proc/net/udp``.
Each run records itself in the store's manifest (updated at every roll).
"""

from __future__ import annotations

import os
import queue
import selectors
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import field

import pyarrow as pa

from rankscope.collectors.errors import ConfigError
from rankscope.collectors.flows import template_state
from rankscope.collectors.flows.flow_decoder import FlowDecoder
from rankscope.collectors.record_class import record
from rankscope.collectors.schema import validate
from rankscope.collectors.store import ManifestEntry, Store, check_job_name

SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
MAX_DATAGRAM = 65535
READS_PER_WAKEUP = 512


@record
class CollectorConfig:
    """How the collector listens and when it writes."""

    listen: tuple[tuple[str, int], ...]
    """(address, port) pairs to bind; port 0 picks a free one (tests)."""
    store: str
    """trace store directory."""
    job: str = "fabric"
    """capture name the flow records are stored under."""
    roll_seconds: float = 5.0
    """write a part at least this often while data arrives."""
    roll_records: int = 200_000
    """write a part once this many decoded records are buffered (bounds memory)."""
    max_seconds: float | None = None
    """stop by itself after this long (None: until SIGTERM/SIGINT or the stop event)."""
    rcvbuf_bytes: int = 64 << 20
    """requested socket receive buffer per port."""
    max_exporters: int = 4096
    """(exporter address, observation domain) pairs whose state is kept (LRU); older ones are forgotten."""
    max_waiting_bytes: int = 4 << 20
    """data sets waiting for their template, all exporters together (every set counts its header)."""

    def __post_init__(self):
        if not self.listen:
            raise ConfigError("collector: expected at least one --listen address:port")
        for addr, port in self.listen:
            if not isinstance(port, int) or not 0 <= port <= 65535:
                raise ConfigError(f"collector: port {port!r} of {addr!r} not in 0..65535")
        check_job_name(self.job)
        if not self.roll_seconds > 0:
            raise ConfigError(f"collector: roll_seconds {self.roll_seconds!r} must be > 0")
        if not isinstance(self.roll_records, int) or self.roll_records < 1:
            raise ConfigError(f"collector: roll_records {self.roll_records!r} must be an integer >= 1")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ConfigError(f"collector: max_seconds {self.max_seconds!r} must be > 0")
        if self.rcvbuf_bytes < 4096:
            raise ConfigError(f"collector: rcvbuf_bytes {self.rcvbuf_bytes!r} must be >= 4096")
        if not isinstance(self.max_exporters, int) or self.max_exporters < 1:
            raise ConfigError(f"collector: max_exporters {self.max_exporters!r} must be an integer >= 1")
        if not isinstance(self.max_waiting_bytes, int) or self.max_waiting_bytes < 0:
            raise ConfigError(f"collector: max_waiting_bytes {self.max_waiting_bytes!r} must be an integer >= 0")


@record(frozen=False)
class CollectorStats:
    datagrams: int = 0
    bytes: int = 0
    records: Counter = field(default_factory=Counter)
    """rows written per record kind."""
    rejects: Counter = field(default_factory=Counter)
    samples: dict = field(default_factory=dict)
    kernel_drops: int = 0
    parts: int = 0
    rcvbuf_bytes: dict = field(default_factory=dict)
    """listen address -> receive buffer the kernel actually granted."""


def parse_listen(text: str) -> tuple[str, int]:
    """'0.0.0.0:4739', '[::]:4739' or ':4739' -> (address, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--listen {text!r}: expected ADDRESS:PORT, e.g. 0.0.0.0:4739")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def kernel_drops(sock: socket.socket) -> int | None:
    """The kernel's drop counter of this UDP socket (last column of /proc/net/udp[6]), if readable."""
    inode = str(os.fstat(sock.fileno()).st_ino)
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if len(cols) >= 13 and cols[9] == inode:
                        return int(cols[-1])
        except OSError:
            continue
    return None


class FlowCollector:
    """Bind, receive, decode and roll parts; see the module docstring."""

    def __init__(self, config: CollectorConfig):
        self.config = config
        self.store = Store(config.store)
        self.decoder = FlowDecoder(max_waiting_bytes=config.max_waiting_bytes, max_exporters=config.max_exporters)
        # templates and options learnt by earlier ingests or collector runs into this capture
        template_state.load_for_collector(self.decoder, self.store, config.job)
        self.stats = CollectorStats()
        self._old_handlers: dict = {}
        self.sockets: list[socket.socket] = []
        self.key = f"collector-{uuid.uuid4().hex[:16]}"
        self.started = time.time()
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=4)
        self._writer: threading.Thread | None = None
        self._write_error: Exception | None = None

    # ------------------------------------------------------------- sockets
    def open(self) -> list[tuple[str, int]]:
        """Bind every listen address; returns the bound (address, port) pairs."""
        bound = []
        for addr, port in self.config.listen:
            family = socket.AF_INET6 if ":" in addr else socket.AF_INET
            s = socket.socket(family, socket.SOCK_DGRAM)
            for opt in (SO_RCVBUFFORCE, socket.SO_RCVBUF):
                try:
                    s.setsockopt(socket.SOL_SOCKET, opt, self.config.rcvbuf_bytes)
                    break
                except OSError:
                    continue
            try:
                s.bind((addr, port))
            except OSError as e:
                s.close()
                self.close()
                raise ConfigError(f"--listen {addr}:{port}: cannot bind ({e.strerror})") from e
            s.setblocking(False)
            self.sockets.append(s)
            here = s.getsockname()[:2]
            bound.append(here)
            self.stats.rcvbuf_bytes[f"{here[0]}:{here[1]}"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        return bound

    def close(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets = []

    def stop(self) -> None:
        """Ask :meth:`run` to drain, write and return (thread- and signal-safe)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the collector gracefully (main thread only; idempotent).

        Call before announcing that the collector listens: a signal that comes
        right after the announcement must not kill it with what it received.
        """
        if self._old_handlers or threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old_handlers[sig] = signal.signal(sig, lambda *_: self._stop.set())

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}

    # ----------------------------------------------------------------- run
    def run(self) -> CollectorStats:
        """Receive until stopped; install SIGTERM/SIGINT handlers when on the main thread."""
        self.install_signal_handlers()
        if not self.sockets:
            self.open()
        sel = selectors.DefaultSelector()
        for s in self.sockets:
            sel.register(s, selectors.EVENT_READ)
        deadline = self.started + self.config.max_seconds if self.config.max_seconds else None
        next_roll = time.monotonic() + self.config.roll_seconds
        try:
            while not self._stop.is_set():
                if deadline is not None and time.time() >= deadline:
                    break
                for key, _ in sel.select(timeout=min(0.2, max(0.0, next_roll - time.monotonic()))):
                    self._read(key.fileobj)
                if (self.decoder.buffered_records >= self.config.roll_records or time.monotonic() >= next_roll
                        or self.decoder.needs_compaction):
                    self.roll()
                    next_roll = time.monotonic() + self.config.roll_seconds
            for s in self.sockets:  # what the kernel queued before the stop was received: keep it
                while self._read(s) == READS_PER_WAKEUP:
                    pass
            self.roll(final=True)
        finally:
            sel.close()
            self._restore_signal_handlers()
            self.close()
        return self.stats

    def _read(self, sock: socket.socket) -> int:
        n = 0
        now = time.time_ns()
        feed = self.decoder.feed
        while n < READS_PER_WAKEUP:
            try:
                data, addr = sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:  # e.g. ECONNREFUSED echoes; never fatal
                self.decoder.reject(f"socket error {e.errno}")
                break
            n += 1
            self.stats.bytes += len(data)
            feed(data, addr[0], now)
            if self.decoder.buffered_records >= self.config.roll_records or self.decoder.needs_compaction:
                self.roll()
        self.stats.datagrams += n
        return n

    def roll(self, final: bool = False) -> None:
        """Hand what was decoded since the last roll to the writer thread; on ``final``, wait for it.

        Validation and Parquet writing (which release the GIL) run beside the
        receive loop, so a roll does not stall reading; the queue is short,
        so memory stays bounded (a full queue makes the loop wait instead).
        """
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="flow-writer", daemon=True)
            self._writer.start()
        drops = [d for d in map(kernel_drops, self.sockets) if d is not None]
        if drops:
            self.stats.kernel_drops = sum(drops)
        tables = self.decoder.flush(final=final)
        if final:  # the next run (or ingest) into this capture starts from what this one learnt and held
            template_state.save_for_collector(self.decoder, self.store, self.config.job)
        if tables or final:
            self._queue.put(tables)
        if final:
            self._queue.put(None)
            self._writer.join()
            self._writer = None
            if self._write_error is not None:
                raise self._write_error

    def _write_loop(self) -> None:
        while (tables := self._queue.get()) is not None:
            try:
                for kind, table in tables.items():
                    v = validate(table.append_column("job", _const(self.config.job, table.num_rows)), kind)
                    self.stats.rejects.update(v.rejects)
                    if v.table.num_rows:
                        self.store.write(kind, v.table, prefix=f"part-{self.key[:26]}")
                        self.stats.records[kind] += v.table.num_rows
                        self.stats.parts += 1
                self._manifest()
            except Exception as e:  # noqa: BLE001 - re-raised in the receive loop at the final roll
                self._write_error = e
        self._manifest()

    def _manifest(self) -> None:
        rejects = Counter(self.stats.rejects)
        rejects.update(self.decoder.rejects)
        entry = ManifestEntry(
            key=self.key, source="udp://" + ",".join(f"{a}:{p}" for a, p in self.config.listen),
            format="collect-flows", job=self.config.job, records=dict(self.stats.records),
            rejects=dict(rejects), samples={k: v[0] for k, v in self.decoder.samples.items()},
            notes={"datagrams": self.stats.datagrams, "bytes": self.stats.bytes,
                   "kernel_drops": self.stats.kernel_drops, "rcvbuf_bytes": self.stats.rcvbuf_bytes,
                   "started_at": self.started, "parts": self.stats.parts})
        self.store.add_manifest(entry)

    def summary_line(self) -> str:
        """Received / stored / dropped / rejected figures, for the exit message."""
        st = self.stats
        recs = ", ".join(f"{k} {v:,}" for k, v in sorted(st.records.items())) or "no records"
        return (f"received {st.datagrams:,} datagram(s) ({st.bytes:,} bytes); stored {recs} in {st.parts} part(s); "
                f"dropped by the kernel {st.kernel_drops:,} datagram(s); rejected {sum(self.all_rejects.values()):,} "
                f"(by reason below); exporters tracked {len(self.decoder._pair_ids):,}")

    @property
    def all_rejects(self) -> Counter:
        c = Counter(self.stats.rejects)
        c.update(self.decoder.rejects)
        return c


def _const(value: str, n: int):
    return pa.array([value] * n, pa.string())
