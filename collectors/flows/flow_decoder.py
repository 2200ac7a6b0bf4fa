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

from collections import Counter, OrderedDict

import numpy as np
import pyarrow as pa

from rankscope.collectors.flows import ipfix, netflow5, netflow9, sflow
from rankscope.collectors.flows.ipfix_elements import SAMPLING, SELECTOR, SYSTEM_INIT_MS
from rankscope.collectors.flows.packet_columns import (
    Layout,
    Pending,
    decode_variable,
    flow_columns,
    variable_columns,
)

SOURCES = ["ipfix", "netflow9", "netflow5", "sflow"]
SAMPLES_PER_REASON = 3
SAMPLE_BYTES = 96
MAX_RATE = 1 << 32
MAX_EPOCH_MS = 16_725_225_600_000  # year 2500: anything later is a corrupt time base
SET_HEADER_BYTES = 4
HELD_SET_OVERHEAD = 96
"""Bytes of bookkeeping (tuple, list slot, bytes object) one held data set costs beyond its payload."""


def held_cost(body) -> int:
    """What one data set waiting for its template counts against the bound: every set costs
    its payload, its 4-byte set header and its bookkeeping, so empty sets cannot bypass it."""
    return len(body) + SET_HEADER_BYTES + HELD_SET_OVERHEAD


class FlowDecoder:
    """Datagrams in, flow tables out; state per exporter and observation domain.

    Per-exporter state (templates, rates, time bases, held data) lives in an
    LRU table of at most ``max_exporters`` (address, domain) pairs: when a new
    pair would exceed it, the least recently seen eighth is forgotten (counted
    as ``exporter state evicted``). At most ``max_templates`` templates are
    kept in all; data sets waiting for a template cost :func:`held_cost` each,
    at most ``max_waiting_bytes`` in all.
    """

    def __init__(self, max_waiting_bytes: int = 4 << 20, max_exporters: int = 4096, max_templates: int = 16384):
        self.pending = Pending()
        self.templates: dict[tuple[str, int, int], Layout] = {}
        self.exporters: list[str] = []
        self._exporter_ids: dict[str, int] = {}
        self._pair_ids: OrderedDict[tuple[str, int], int] = OrderedDict()
        self.max_exporters = max_exporters
        self.max_templates = max_templates
        self.hold_waiting = False
        """When True (file ingest with a store), data still waiting at the final flush is kept, not rejected."""
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
            idx = self._exporter_ids[name] = len(self.exporters)
            self.exporters.append(name)
        return idx

    def exporter_id(self, addr: str, domain: int) -> int:
        """exporter_index of 'addr/domain', cached on the pair (no string built per datagram)."""
        pair = (addr, domain)
        idx = self._pair_ids.get(pair)
        if idx is None:
            if len(self._pair_ids) >= self.max_exporters:
                self._evict(max(1, self.max_exporters // 8))
            idx = self._pair_ids[pair] = self.exporter_index(f"{addr}/{domain}")
        else:
            self._pair_ids.move_to_end(pair)
        return idx

    def _evict(self, count: int) -> None:
        """Forget the state of the ``count`` least recently seen exporters (one pass over each table)."""
        gone = set()
        for _ in range(min(count, len(self._pair_ids))):
            gone.add(self._pair_ids.popitem(last=False)[1])
        self.rejects["exporter state evicted (LRU table full)"] += len(gone)
        self.templates = {k: v for k, v in self.templates.items() if k[1] not in gone}
        for key in [k for k in self.waiting if k[1] in gone]:
            sets = self.waiting.pop(key)
            self.waiting_bytes -= sum(held_cost(b) for b, _, _ in sets)
            self.reject(f"{key[0]}: data set for an unknown template (exporter evicted)", count=len(sets))
        self.rates = {e: r for e, r in self.rates.items() if e not in gone}
        self.selector_rates = {k: r for k, r in self.selector_rates.items() if k[0] not in gone}
        self.system_init_ms = {e: v for e, v in self.system_init_ms.items() if e not in gone}

    @property
    def needs_compaction(self) -> bool:
        """The exporter name table has outgrown the live exporters (call :meth:`flush` to compact it)."""
        return len(self.exporters) > 2 * self.max_exporters + 1024

    def _compact(self) -> None:
        """Renumber exporters so only live ones keep a name; call only with nothing pending."""
        live = sorted(set(self._pair_ids.values()) | {k[1] for k in self.templates} | {k[1] for k in self.waiting}
                      | set(self.rates) | {k[0] for k in self.selector_rates} | set(self.system_init_ms))
        new = {old: i for i, old in enumerate(live)}
        self.exporters = [self.exporters[i] for i in live]
        self._exporter_ids = {name: i for i, name in enumerate(self.exporters)}
        self._pair_ids = OrderedDict((p, new[i]) for p, i in self._pair_ids.items())
        self.templates = {(p, new[e], t): v for (p, e, t), v in self.templates.items()}
        self.waiting = {(p, new[e], t): v for (p, e, t), v in self.waiting.items()}
        self.rates = {new[e]: r for e, r in self.rates.items()}
        self.selector_rates = {(new[e], s): r for (e, s), r in self.selector_rates.items()}
        self.system_init_ms = {new[e]: v for e, v in self.system_init_ms.items()}

    def base_ms(self, exporter: int) -> int:
        return self.system_init_ms.get(exporter, -1)

    def note_boot_ms(self, exporter: int, lower_bound_ms: int) -> None:
        """One packet's lower bound of its exporter's boot time (NetFlow v9: whole UNIX seconds minus
        sysUptime): the exporter's time base is the latest bound seen, filled into its records at flush."""
        if not 0 <= lower_bound_ms < MAX_EPOCH_MS:
            self.reject("netflow9: header time before 1970 or beyond year 2500")
            return
        if lower_bound_ms > self.system_init_ms.get(exporter, -1):
            self.system_init_ms[exporter] = lower_bound_ms

    # ----------------------------------------------------------- templates
    def set_template(self, proto: str, exporter: int, tid: int, layout: Layout | None) -> None:
        key = (proto, exporter, tid)
        if layout is None:
            self.templates.pop(key, None)
            return
        old = self.templates.get(key)
        if old is not None and old.fields == layout.fields and old.scope_count == layout.scope_count:
            layout = old  # a periodic refresh: keep one layout so its records decode in one batch
        elif old is None and len(self.templates) >= self.max_templates:
            self.reject(f"{proto}: template table full ({self.max_templates} templates)")
            return
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
            cost = held_cost(body)
            if self.waiting_bytes + cost > self.max_waiting_bytes:
                self.reject(f"{proto}: data set for an unknown template (waiting buffer full)")
                return
            # UDP exporters may send data before the template; keep it until the template comes.
            self.waiting.setdefault((proto, exporter, tid), []).append((bytes(body), export_s, base_ms))
            self.waiting_bytes += cost
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

    # -------------------------------------------------------------- output
    def _late_context(self, ctx: dict[str, np.ndarray]) -> None:
        """Fill a time base or sampling rate that was unknown when a data set arrived but is known now.

        Data sets held for their template, or sent before the options data in the
        same message or file, would otherwise lose their sysUpTime-based times.
        """
        for col, known in (("base_ms", self.system_init_ms), ("rate", self.rates)):
            unknown = ctx[col] < 0 if col == "base_ms" else ctx[col] == 0
            if not known or not unknown.any():
                continue
            for e in np.unique(ctx["exporter"][unknown]):
                value = known.get(int(e))
                if value is not None:
                    ctx[col][unknown & (ctx["exporter"] == e)] = value

    @property
    def held_sets(self) -> int:
        return sum(len(v) for v in self.waiting.values())

    @property
    def buffered_records(self) -> int:
        return self.pending.records + len(self.sflow_rows) + len(self.counter_rows)

    def flush(self, final: bool = False) -> dict[str, pa.Table]:
        """Tables of every record decoded since the last flush (kind -> table).

        With ``final``, data sets still waiting for a template are counted as
        rejects (they can no longer be decoded), unless :attr:`hold_waiting`
        keeps them for the next file (see :mod:`template_state`).
        """
        out: dict[str, list[pa.Table]] = {}
        for _layout, cols, n, ctx in self.pending.drain():
            self._late_context(ctx)
            t = flow_columns(cols, n, ctx, self.exporters, SOURCES, self.selector_rates, self.rejects)
            if t is not None and t.num_rows:
                out.setdefault("flow", []).append(t)
        if self.sflow_rows:
            out.setdefault("flow", []).append(sflow.flow_table(self.sflow_rows))
            self.sflow_rows = []
        if self.counter_rows:
            out.setdefault("interface_counter", []).append(sflow.counter_table(self.counter_rows))
            self.counter_rows = []
        if final and not self.hold_waiting:
            for (proto, _, _), sets in self.waiting.items():
                self.reject(f"{proto}: data set for an unknown template", count=len(sets))
            self.waiting, self.waiting_bytes = {}, 0
        if self.needs_compaction:
            self._compact()
        tables = {k: pa.concat_tables(v, promote_options="permissive") for k, v in out.items()}
        self.records_out += sum(t.num_rows for t in tables.values())
        return tables
