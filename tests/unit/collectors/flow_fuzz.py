"""A structure-aware fuzzer over the flow decoders: IPFIX, NetFlow v9 / v5, sFlow v5 and pcap.

Seeds are real exporters' datagrams (softflowd fixtures, goflow2's router and
switch captures in tests/data/goflow2) and hand-built ones covering every
information element rankscope reads. Each fuzzed datagram is one seed with
mutations that keep enough structure to reach the decoders:

- plain byte damage: bit flips, truncation, inserted junk, splices of two datagrams;
- a length, count or id field (16- or 32-bit, at a set / record boundary)
  set to an extreme: 0, 1, 3, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF;
- random templates (any element the decoders read, lengths 0-9, 16, 65535)
  followed by data sets of random bytes: every column gets huge numbers;
- sFlow samples and records with random counts and lengths.

Some datagrams are also written as pcap files (with corrupt record headers
now and then) and read through :func:`capture_datagrams`. Every decoded
table is validated against its record kind, like ingest does.

The oracle: nothing raises (a raise is a traceback, counted with the input);
every record either comes out or is counted under a reason. Used by
``test_flow_input_fuzz.py`` (fixed seed, ~20 s) and
``benchmarks/bench_input_fuzz.py --flow-packets`` (>= 1,000,000 packets).
"""

from __future__ import annotations

import io
import random
import struct
import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from rankscope.collectors.flows import ipfix_elements as ie
from rankscope.collectors.flows.flow_decoder import FlowDecoder
from rankscope.collectors.flows.flow_files import capture_datagrams
from rankscope.collectors.schema import validate
from tests.unit.collectors import flow_builders as fb

FIXTURES = Path(__file__).parent / "fixtures"
REAL = Path(__file__).parents[2] / "data" / "goflow2"
EXTREMES16 = [0, 1, 3, 4, 0x7FFF, 0xFFFF, 0x100]
EXTREMES32 = [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xF0000000]
LENGTHS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 65535]


@dataclass
class FlowFuzzCounts:
    packets: int = 0
    pcap_files: int = 0
    records: Counter = field(default_factory=Counter)
    rejects: Counter = field(default_factory=Counter)
    schema_rejects: Counter = field(default_factory=Counter)
    tracebacks: list = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.packets:,} flow packets ({self.pcap_files:,} pcap files): "
                f"{sum(self.records.values()):,} records decoded, {sum(self.rejects.values()):,} counted as "
                f"bad by the decoders ({len(self.rejects)} reasons), {sum(self.schema_rejects.values()):,} by the "
                f"schema, {len(self.tracebacks)} tracebacks")


def seeds() -> list[bytes]:
    """Real datagrams plus hand-built ones that use every element the decoders read."""
    out = fb.seed_datagrams(FIXTURES)
    import dpkt

    for p in sorted(REAL.glob("*.pcap")):
        with open(p, "rb") as f:
            out.extend(bytes(dpkt.ethernet.Ethernet(fr).data.data.data) for _, fr in dpkt.pcap.Reader(f))
    rng = random.Random(1)
    for _ in range(4):
        out.append(random_template_message(rng, ipfix=True))
        out.append(random_template_message(rng, ipfix=False))
    return out


def random_template_message(rng: random.Random, ipfix: bool) -> bytes:
    """A template of random known elements with random lengths, then data of random bytes."""
    elems = rng.sample(sorted(ie.ELEMENTS), rng.randint(1, 12))
    fields = [(e, rng.choice(LENGTHS) if rng.random() < 0.3 else _natural(e)) for e in elems]
    if ipfix and rng.random() < 0.2:
        fields.append((rng.randint(1, 500), 65535, rng.randint(1, 1 << 31)))  # enterprise, variable length
    tid = rng.choice([256, 257, 300, 65535, rng.randint(0, 70000) & 0xFFFF])
    reclen = sum(f[1] if f[1] != 65535 else 3 for f in fields)
    records = [rng.randbytes(max(reclen, 1)) for _ in range(rng.randint(0, 6))]
    if rng.random() < 0.5:
        records = [r[:4] + b"\xff" * max(0, len(r) - 4) for r in records]  # all-ones values
    if ipfix:
        sets = [fb.template_set({tid: fields}), fb.data_set(tid, records)]
        if rng.random() < 0.3:
            sets.insert(1, fb.options_template_set((tid + 1) & 0xFFFF, [(149, 4)], [(34, 4), (160, 8)]))
            sets.append(fb.data_set((tid + 1) & 0xFFFF, [rng.randbytes(16)]))
        return fb.ipfix_message(sets, domain=rng.choice([0, 1, 0xFFFFFFFF]), export_s=rng.getrandbits(32))
    fields = [(e, n if n not in (0, 65535) else 4) for e, n, *_ in fields]
    return fb.nf9_packet([fb.nf9_template({tid: fields}), fb.data_set(tid, records, pad_to=4)],
                         uptime_ms=rng.getrandbits(32), unix_s=rng.getrandbits(32), source_id=rng.getrandbits(32))


def _natural(e: int) -> int:
    kind = ie.kind_of(e)
    return {"ipv4": 4, "ipv6": 16, "ntp": 8}.get(kind, 2 if e in (7, 11, 58, 243) else 4)


def _boundaries(data: bytes) -> list[int]:
    """Offsets of length / count / id fields: datagram headers and IPFIX / v9 set headers."""
    out = [0, 2, 4, 6, 8, 12, 16, 20, 24, 28]
    version = data[1] if len(data) > 1 else 0
    pos = 16 if version == 10 else 20 if version == 9 else len(data)
    while pos + 4 <= len(data):
        out += [pos, pos + 2, pos + 4, pos + 6, pos + 8]
        length = struct.unpack_from(">H", data, pos + 2)[0]
        if length < 4:
            break
        pos += length
    return [o for o in out if o < len(data)]


def mutate(rng: random.Random, pool: list[bytes]) -> bytes:
    base = bytearray(rng.choice(pool))
    op = rng.randrange(8)
    if op == 0 and base:
        for _ in range(rng.randint(1, 6)):
            base[rng.randrange(len(base))] = rng.getrandbits(8)
    elif op == 1:
        base = base[:rng.randrange(len(base) + 1)]
    elif op == 2:
        pos = rng.randrange(len(base) + 1)
        base[pos:pos] = rng.randbytes(rng.randint(1, 40))
    elif op == 3:
        other = rng.choice(pool)
        base = base[:rng.randrange(len(base) + 1)] + other[rng.randrange(len(other) + 1):]
    elif op in (4, 5) and base:
        pos = rng.choice(_boundaries(bytes(base)))
        if op == 4 or pos + 4 > len(base):
            base[pos:pos + 2] = struct.pack(">H", rng.choice(EXTREMES16))
        else:
            base[pos:pos + 4] = struct.pack(">I", rng.choice(EXTREMES32))
    elif op == 6:
        return random_template_message(rng, ipfix=rng.random() < 0.6)
    else:
        return _sflow_mutant(rng)
    return bytes(base)


def _sflow_mutant(rng: random.Random) -> bytes:
    frame = fb.ethernet_ipv4_udp("10.1.0.1", "10.1.0.2", rng.getrandbits(16), 4791,
                                 fb.bth(rng.getrandbits(8), rng.getrandbits(24)) + b"\0" * 16,
                                 vlan=rng.choice([None, 0, 4095]))
    samples = [fb.sflow_flow_sample(frame, rng.getrandbits(32), rng.getrandbits(28), rng.getrandbits(32),
                                    rng.getrandbits(32), switch_vlan=rng.choice([None, 0xFFFFFFFF, 5])),
               fb.sflow_counter_sample(rng.getrandbits(32), rng.getrandbits(64), rng.getrandbits(64),
                                       rng.getrandbits(64))]
    d = bytearray(fb.sflow_datagram(rng.sample(samples, rng.randint(1, 2)), sub_agent=rng.getrandbits(32)))
    for _ in range(rng.randint(0, 3)):  # a count or length somewhere to an extreme
        pos = rng.randrange(0, max(1, len(d) - 4)) & ~3
        d[pos:pos + 4] = struct.pack(">I", rng.choice(EXTREMES32))
    return bytes(d)


def _drain(dec: FlowDecoder, c: FlowFuzzCounts, final: bool) -> None:
    for kind, t in dec.flush(final=final).items():
        v = validate(t.append_column("job", pa.array(["fuzz"] * t.num_rows)), kind)
        c.records[kind] += v.table.num_rows
        c.schema_rejects.update(v.rejects)


def _pcap_bytes(rng: random.Random, payloads: list[bytes]) -> bytes:
    out = io.BytesIO()
    out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    for i, p in enumerate(payloads):
        frame = fb.ethernet_ipv4_udp("198.51.100.1", "192.0.2.1", 5000, 4739, p)
        incl = len(frame) if rng.random() > 0.02 else rng.choice(EXTREMES32)
        out.write(struct.pack("<IIII", 1_700_000_000 + i, 0, incl, len(frame)) + frame)
    data = out.getvalue()
    return data[:rng.randrange(len(data))] if rng.random() < 0.05 else data


def run(seed: int, packets: int, per_pcap: int = 200, pcap_share: float = 0.2) -> FlowFuzzCounts:
    """Fuzz ``packets`` datagrams; a share of them travels inside pcap files."""
    rng = random.Random(seed)
    pool = seeds()
    c = FlowFuzzCounts()
    dec = FlowDecoder()
    for s in pool:  # learn real templates first, so mutated data sets reach the column decoders
        dec.feed(s, "127.0.0.1", 1)
    with tempfile.TemporaryDirectory() as tmp:
        while c.packets < packets:
            batch = [mutate(rng, pool) for _ in range(min(per_pcap, packets - c.packets))]
            as_pcap = rng.random() < pcap_share
            try:
                if as_pcap:
                    path = Path(tmp) / "f.pcap"
                    path.write_bytes(_pcap_bytes(rng, batch))
                    fdec = FlowDecoder()
                    for payload, addr, ts in capture_datagrams(path, fdec):
                        fdec.feed(payload, addr, ts)
                    _drain(fdec, c, True)
                    c.rejects.update(fdec.rejects)
                    c.pcap_files += 1
                else:
                    for pkt in batch:
                        dec.feed(pkt, "127.0.0.1", 1)
                    if dec.buffered_records > 20_000 or rng.random() < 0.05:
                        _drain(dec, c, False)
            except Exception:  # noqa: BLE001 - the oracle: any raise is a finding
                c.tracebacks.append((batch[0][:64].hex(), traceback.format_exc(limit=3)))
                dec = FlowDecoder()
            c.packets += len(batch)
    _drain(dec, c, True)
    c.rejects.update(dec.rejects)
    return c
