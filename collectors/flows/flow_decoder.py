"""One stateful decoder for every flow export protocol, fed datagram by datagram.

:class:`FlowDecoder` detects the protocol of each datagram (IPFIX, NetFlow v9,
NetFlow v5, sFlow v5), keeps the per-exporter state the protocols need
(templates, time bases, sampling rates), queues data records and turns them
into ``flow`` and ``interface_counter`` tables on :meth:`flush`. Nothing in
here raises on bad input: a malformed datagram or set is counted under a
reason in :attr:`rejects`, with the first few offending datagrams kept (hex)
in :attr:`samples`; the well-formed parts of the same datagram still decode.
The live collector and every file format share it.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pyarrow as pa

from rankscope.collectors.flows import ipfix, netflow5, netflow9, sflow
from rankscope.collectors.flows.ipfix_elements import SAMPLING, SELECTOR, SYSTEM_INIT_MS
from rankscope.collectors.flows.packet_columns import (
    Field,
    Layout,
    Pending,
    decode_variable,
    flow_columns,
    layout_for,
    variable_columns,
)

SOURCES = ["ipfix", "netflow9", "netflow5", "sflow"]
SAMPLES_PER_REASON = 3
SAMPLE_BYTES = 96
MAX_RATE = 1 << 32
MAX_EPOCH_MS = 16_725_225_600_000  # year 2500: anything later is a corrupt time base
HELD_SET_OVERHEAD = 128
"""Bytes one held data set costs beyond its body: the set header and the Python objects that keep it
(an empty data set costs this much, so a flood of them cannot hold memory for free)."""
MAX_EXPORTERS = 16_384
"""Per-exporter state (templates, options, held data) is kept for at most this many (address, domain)
pairs; exporters idle longer than ``EXPORTER_TTL_S`` are dropped when the table fills."""
EXPORTER_TTL_S = 1800.0


class ExporterTableFull(ValueError):
    """A new exporter arrived while every slot of the table is held by an active one."""


def held_cost(body) -> int:
    return len(body) + HELD_SET_OVERHEAD


class FlowDecoder:
    """Datagrams in, flow tables out; state per exporter and observation domain."""

    def __init__(self, max_waiting_bytes: int = 4 << 20, max_exporters: int = MAX_EXPORTERS,
                 exporter_ttl_s: float = EXPORTER_TTL_S):
        self.max_exporters = max_exporters
        self.exporter_ttl_s = exporter_ttl_s
        self.last_seen: list[float] = []
        self.now = time.monotonic()
        self.pending = Pending()
        self.templates: dict[tuple[str, int, int], Layout] = {}
        self.exporters: list[str] = []
        self._exporter_ids: dict[str, int] = {}
        self._pair_ids: dict[tuple[str, int], int] = {}
        self.rates: dict[int, int] = {}
        self.selector_rates: dict[tuple[int, int], int] = {}
        self.system_init_ms: dict[int, int] = {}
        self.waiting: dict[tuple[str, int, int], list] = {}
        self.waiting_bytes = 0
        self.max_waiting_bytes = max_waiting_bytes
        self.rejects: Counter = Counter()
        self.samples: dict[str, list[str]] = {}
        self.datagrams = 0
        self.records_out = 0
        self.sflow_rows: list[tuple] = []
        self.counter_rows: list[tuple] = []

    # --------------------------------------------------------------- input
    def feed(self, data: bytes, addr: str, recv_ns: int = 0) -> None:
        """Decode one datagram (or one message of a file) from exporter address ``addr``."""
        self.datagrams += 1
        self.now = time.monotonic()
        if len(data) < 4:
            self.reject("datagram shorter than 4 bytes", data)
            return
        version = (data[0] << 8) | data[1]
        try:
            if version == 10:
                ipfix.parse_message(self, data, addr)
            elif version == 9:
                netflow9.parse_packet(self, data, addr)
            elif version == 5:
                netflow5.parse_packet(self, data, addr)
            elif version == 0 and data[2] == 0 and data[3] == 5:
                sflow.parse_datagram(self, data, addr, recv_ns)
            else:
                self.reject("unknown export protocol version", data)
        except ExporterTableFull:
            self.reject(f"exporter table full ({self.max_exporters} exporters active within "
                        f"{self.exporter_ttl_s:g} s)", data)
        except (ValueError, IndexError, OverflowError, TypeError) as e:  # struct.error is a ValueError
            # Decoders check lengths before reading; this is the last line for what slipped through.
            self.reject(f"undecodable datagram ({type(e).__name__})", data)

    def reject(self, reason: str, data: bytes | None = None, count: int = 1) -> None:
        self.rejects[reason] += count
        if data is not None:
            kept = self.samples.setdefault(reason, [])
            if len(kept) < SAMPLES_PER_REASON:
                kept.append(bytes(data[:SAMPLE_BYTES]).hex())

    def exporter_index(self, name: str) -> int:
        idx = self._exporter_ids.get(name)
        if idx is None:
            if len(self.exporters) >= self.max_exporters:
                raise ExporterTableFull(name)
            idx = self._exporter_ids[name] = len(self.exporters)
            self.exporters.append(name)
            self.last_seen.append(0.0)
        self.last_seen[idx] = self.now
        return idx

    def exporter_id(self, addr: str, domain: int) -> int:
        """exporter_index of 'addr/domain', cached on the pair (no string built per datagram)."""
        idx = self._pair_ids.get((addr, domain))
        if idx is None:
            idx = self._pair_ids[(addr, domain)] = self.exporter_index(f"{addr}/{domain}")
        else:
            self.last_seen[idx] = self.now
        return idx

    def _compact_exporters(self) -> None:
        """Drop the state of exporters idle for ``EXPORTER_TTL_S`` (only between flushes: pending
        records refer to exporters by index)."""
        keep = [i for i, t in enumerate(self.last_seen) if self.now - t < self.exporter_ttl_s]
        if len(keep) == len(self.exporters):
            return
        new = {old: k for k, old in enumerate(keep)}
        self.exporters = [self.exporters[i] for i in keep]
        self.last_seen = [self.last_seen[i] for i in keep]
        self._exporter_ids = {n: k for k, n in enumerate(self.exporters)}
        self._pair_ids = {p: new[i] for p, i in self._pair_ids.items() if i in new}
        self.templates = {(pr, new[e], t): v for (pr, e, t), v in self.templates.items() if e in new}
        self.rates = {new[e]: r for e, r in self.rates.items() if e in new}
        self.selector_rates = {(new[e], sel): r for (e, sel), r in self.selector_rates.items() if e in new}
        self.system_init_ms = {new[e]: v for e, v in self.system_init_ms.items() if e in new}
        dropped = sum(len(v) for (_, e, _), v in self.waiting.items() if e not in new)
        if dropped:
            self.reject("data set for an unknown template (its exporter went idle)", count=dropped)
        self.waiting = {(pr, new[e], t): v for (pr, e, t), v in self.waiting.items() if e in new}
        self.waiting_bytes = sum(held_cost(b) for v in self.waiting.values() for b, _, _ in v)

    def base_ms(self, exporter: int) -> int:
        return self.system_init_ms.get(exporter, -1)

    # ----------------------------------------------------------- templates
    def set_template(self, proto: str, exporter: int, tid: int, layout: Layout | None) -> None:
        key = (proto, exporter, tid)
        if layout is None:
            self.templates.pop(key, None)
            return
        old = self.templates.get(key)
        if old is not None and old.fields == layout.fields and old.scope_count == layout.scope_count:
            layout = old  # a periodic refresh: keep one layout so its records decode in one batch
        self.templates[key] = layout
        for body, export_s, base_ms in self.waiting.pop(key, []):
            self.waiting_bytes -= held_cost(body)
            self.data_set(proto, exporter, tid, body, export_s, base_ms)

    def withdraw_all(self, proto: str, exporter: int, options: bool) -> None:
        for key in [k for k, v in self.templates.items()
                    if k[0] == proto and k[1] == exporter and (v.scope_count > 0) == options]:
            del self.templates[key]

    def data_set(self, proto: str, exporter: int, tid: int, body, export_s: int, base_ms: int) -> None:
        layout = self.templates.get((proto, exporter, tid))
        if layout is None:
            if self.waiting_bytes + held_cost(body) > self.max_waiting_bytes:
                self.reject(f"{proto}: data set for an unknown template (waiting buffer full)")
                return
            # UDP exporters may send data before the template; keep it until the template comes.
            self.waiting.setdefault((proto, exporter, tid), []).append((bytes(body), export_s, base_ms))
            self.waiting_bytes += held_cost(body)
            return
        if layout.scope_count:
            self._options(exporter, layout, body)
            return
        ctx = (exporter, export_s, base_ms, self.rates.get(exporter, 0), SOURCES.index(proto))
        size = layout.record_length
        if size is not None:
            n = len(body) // size
            if n:
                self.pending.add_fixed(layout, body if n * size == len(body) else bytes(body[:n * size]), n, ctx)
            return
        values, n, overrun = decode_variable(layout, body)
        if overrun:
            self.reject(f"{proto}: variable-length record overruns its set", bytes(body))
        if n:
            self.pending.add_decoded(layout, variable_columns(values), n, ctx)

    def _options(self, exporter: int, layout: Layout, body) -> None:
        cols = ipfix.decode_options(layout, body)
        if not cols:
            return
        n = len(next(iter(cols.values())))
        if SYSTEM_INIT_MS in cols:
            init_ms = int(cols[SYSTEM_INIT_MS][-1])
            if init_ms < MAX_EPOCH_MS:
                self.system_init_ms[exporter] = init_ms
            else:
                self.reject("options: systemInitTimeMilliseconds beyond year 2500")
        rate = None
        for e in SAMPLING:
            if e in cols:
                rate = np.minimum(cols[e].astype(np.uint64), np.uint64(MAX_RATE)).astype(np.int64)
                if e == 305 and 306 in cols:
                    rate = (rate + cols[306].astype(np.int64)) // np.maximum(rate, 1)
                break
        if rate is None:
            return
        selector = next((cols[e] for e in SELECTOR if e in cols), None)
        for i in range(n):
            if not 0 < rate[i] < MAX_RATE:
                self.reject("options: sampling rate not in 1..2^32-1")
                continue
            if selector is not None:
                self.selector_rates[(exporter, int(selector[i]))] = int(rate[i])
            else:
                self.rates[exporter] = int(rate[i])

    # ------------------------------------------------------- state kept across files
    def snapshot(self) -> dict:
        """Templates, options and held data sets, JSON-able, keyed by exporter name (not index)."""
        name = self.exporters.__getitem__
        return {
            "templates": [[proto, name(e), tid, [[f.element, f.length] for f in lay.fields], lay.template_id,
                           lay.scope_count] for (proto, e, tid), lay in self.templates.items()],
            "rates": [[name(e), r] for e, r in self.rates.items()],
            "selector_rates": [[name(e), sel, r] for (e, sel), r in self.selector_rates.items()],
            "system_init_ms": [[name(e), ms] for e, ms in self.system_init_ms.items()],
            "waiting": [[proto, name(e), tid, body.hex(), export_s, base_ms]
                        for (proto, e, tid), sets in self.waiting.items() for body, export_s, base_ms in sets],
        }

    def restore(self, state: dict) -> None:
        """Start from a :meth:`snapshot` (of earlier files); entries of the wrong shape are skipped and
        counted, never raised: the state file lives in a store a user can edit."""
        idx = self.exporter_index
        for kind, rows in state.items():
            if kind in ("version",) or not isinstance(rows, list):
                continue
            for row in rows:
                try:
                    if kind == "templates":
                        proto, e, tid, fields, template_id, scope = row
                        self.templates[(str(proto), idx(str(e)), int(tid))] = layout_for(
                            [Field(int(a), int(b)) for a, b in fields], int(template_id), int(scope))
                    elif kind == "rates":
                        self.rates[idx(str(row[0]))] = int(row[1])
                    elif kind == "selector_rates":
                        self.selector_rates[(idx(str(row[0])), int(row[1]))] = int(row[2])
                    elif kind == "system_init_ms":
                        self.system_init_ms[idx(str(row[0]))] = int(row[1])
                    elif kind == "waiting":
                        proto, e, tid, body, export_s, base_ms = row
                        body = bytes.fromhex(body)
                        if self.waiting_bytes + held_cost(body) <= self.max_waiting_bytes:
                            self.waiting.setdefault((str(proto), idx(str(e)), int(tid)), []).append(
                                (body, int(export_s), int(base_ms)))
                            self.waiting_bytes += held_cost(body)
                except (TypeError, ValueError):
                    self.reject(f"template state: malformed {kind} entry")

    # -------------------------------------------------------------- output
    @property
    def buffered_records(self) -> int:
        return self.pending.records + len(self.sflow_rows) + len(self.counter_rows)

    def flush(self, final: bool = False, hold: bool = False) -> dict[str, pa.Table]:
        """Tables of every record decoded since the last flush (kind -> table).

        With ``final``, data sets still waiting for a template are counted as
        rejects (they can no longer be decoded), unless ``hold`` keeps them for
        the next file (see template_state).
        """
        out: dict[str, list[pa.Table]] = {}
        for _layout, cols, n, ctx in self.pending.drain():
            t = flow_columns(cols, n, ctx, self.exporters, SOURCES, self.selector_rates, self.rejects)
            if t is not None and t.num_rows:
                out.setdefault("flow", []).append(t)
        if self.sflow_rows:
            out.setdefault("flow", []).append(sflow.flow_table(self.sflow_rows))
            self.sflow_rows = []
        if self.counter_rows:
            out.setdefault("interface_counter", []).append(sflow.counter_table(self.counter_rows))
            self.counter_rows = []
        if final and not hold:
            for (proto, _, _), sets in self.waiting.items():
                self.reject(f"{proto}: data set for an unknown template", count=len(sets))
            self.waiting, self.waiting_bytes = {}, 0
        if len(self.exporters) >= self.max_exporters // 2:
            self._compact_exporters()  # pending is drained: exporter indexes can change now
        tables = {k: pa.concat_tables(v, promote_options="permissive") for k, v in out.items()}
        self.records_out += sum(t.num_rows for t in tables.values())
        return tables
