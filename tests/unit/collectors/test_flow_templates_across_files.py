"""Templates outlive files: rotated captures whose templates come only every N files decode whole.

Collectors such as nfcapd rotate their files every few minutes, and exporters
(softflowd, routers) refresh templates every N packets or minutes, so most
files hold data sets only. Each test writes such a rotation as pcap files and
ingests it in one command, and file by file in separate ingests, and counts
every record.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import dpkt
import pytest

from rankscope.collectors.flows import template_state
from rankscope.collectors.flows.flow_decoder import FlowDecoder, held_cost
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store
from tests.unit.collectors.flow_builders import (
    data_set,
    ethernet_ipv4_udp,
    ipfix_message,
    nf9_options_template,
    nf9_packet,
    nf9_template,
    options_template_set,
    template_set,
    u,
    v4,
)

T0 = 1_700_000_000
BOOT_MS = (T0 - 3600) * 1000  # the exporter booted an hour before the capture
EXPORTER = "198.51.100.7"
FLOW_FIELDS = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (22, 4), (21, 4)]


def _record(i: int) -> bytes:
    up_ms = 3600_000 + i * 10
    return (v4(f"10.0.{i // 250}.{i % 250 + 1}") + v4("10.9.0.1") + u(40000 + i % 1000, 2) + u(4791, 2) + u(17, 1)
            + u(1000 + i, 8) + u(2, 8) + u(up_ms, 4) + u(up_ms + 5, 4))


def _write_pcap(path: Path, datagrams: list[tuple[float, bytes]]) -> None:
    with open(path, "wb") as f:
        w = dpkt.pcap.Writer(f)
        for ts, payload in datagrams:
            w.writepkt(ethernet_ipv4_udp(EXPORTER, "192.0.2.1", 50000, 4739, payload), ts=ts)


def _ipfix_templates(sampling: bool) -> bytes:
    sets = [template_set({256: FLOW_FIELDS})]
    opts = [(160, 8)] + ([(34, 4)] if sampling else [])
    sets.append(options_template_set(257, [(149, 4)], opts))
    rec = u(7, 4) + u(BOOT_MS, 8) + (u(100, 4) if sampling else b"")
    sets.append(data_set(257, [rec]))
    return ipfix_message(sets, domain=7, export_s=T0)


def _nf9_templates(sampling: bool) -> bytes:
    sets = [nf9_template({300: FLOW_FIELDS})]
    if sampling:
        sets.append(nf9_options_template(301, [(1, 4)], [(34, 4)]))
        sets.append(data_set(301, [u(0, 4) + u(100, 4)], pad_to=4))
    return nf9_packet(sets, uptime_ms=T0 * 1000 - BOOT_MS, unix_s=T0, source_id=9)


def _rotation(tmp: Path, proto: str, sampling: bool, files: int, every: int, first: int,
              msgs: int = 4, per_msg: int = 3) -> tuple[list[Path], int]:
    """Write ``files`` rotated captures; templates in file ``first`` and every ``every`` after it.

    File names run against capture time (the ingest must order them itself).
    Returns (paths, data records written).
    """
    paths, n = [], 0
    for f in range(files):
        grams = []
        t = T0 + 300 * f
        if f >= first and (f - first) % every == 0:
            grams.append((t, _ipfix_templates(sampling) if proto == "ipfix" else _nf9_templates(sampling)))
        for m in range(msgs):
            recs = [_record(n + k) for k in range(per_msg)]
            n += per_msg
            if proto == "ipfix":
                msg = ipfix_message([data_set(256, recs)], domain=7, export_s=t + m + 1, seq=n)
            else:
                msg = nf9_packet([data_set(300, recs, pad_to=4)], uptime_ms=(t + m + 1) * 1000 - BOOT_MS,
                                 unix_s=t + m + 1, source_id=9)
            grams.append((t + m + 1, msg))
        p = tmp / f"rot-{files - f:03d}.pcap"
        _write_pcap(p, grams)
        paths.append(p)
    return paths, n


def _check(store: Store, n: int, sampling: bool) -> None:
    df = store.read("flow")
    assert df.height == n
    assert sorted(df["size_bytes"].to_list()) == [1000 + i for i in range(n)]
    assert set(df["sampling_rate"].to_list()) == ({100} if sampling else {1})
    # sysUpTime-relative times were placed with the options' systemInitTimeMilliseconds (IPFIX)
    # or the header's uptime (v9): record i started at boot + 3600 s + 10 i ms.
    first = df.filter(df["size_bytes"] == 1000)
    assert first["start_ns"][0] == (T0 * 1000 + 0) * 1_000_000


@pytest.mark.parametrize("proto", ["ipfix", "netflow9"])
@pytest.mark.parametrize("sampling", [False, True])
def test_rotated_captures_in_one_ingest_decode_every_record(tmp_path, proto, sampling):
    paths, n = _rotation(tmp_path, proto, sampling, files=9, every=4, first=2)
    store = Store(tmp_path / "st")
    summary = ingest(store, [tmp_path])
    assert summary.count("failed") == 0, [f.error for f in summary.files]
    assert not summary.rejects, summary.rejects
    _check(store, n, sampling)


@pytest.mark.parametrize("proto", ["ipfix", "netflow9"])
def test_rotated_captures_in_separate_ingests_decode_every_record(tmp_path, proto):
    """Files arrive one ingest at a time, newest template state kept in the store between them."""
    paths, n = _rotation(tmp_path, proto, True, files=7, every=3, first=1)
    store = Store(tmp_path / "st")
    for p in reversed(paths):  # written newest-name-first: reversed is capture order
        s = ingest(store, [p])
        assert s.count("failed") == 0, [f.error for f in s.files]
    _check(Store(tmp_path / "st"), n, True)
    state = json.loads((tmp_path / "st" / template_state.STATE_DIR / "job=fabric" / template_state.STATE_FILE).read_text())
    assert state["held"] == []  # everything held was decoded by a later file
    assert {t[2] for t in state["templates"]} >= {256 if proto == "ipfix" else 300}


def test_data_file_before_its_template_file_across_ingests_and_reingest_is_skipped(tmp_path):
    data_dir = Path(__file__).parents[2] / "data" / "goflow2"
    store = Store(tmp_path / "st")
    first = ingest(store, [data_dir / "nf9-data.pcap"])
    assert first.files[0].status == "ingested" and store.count("flow") == 0
    ingest(store, [data_dir / "nf9-template.pcap"])
    assert store.count("flow") == 21
    again = ingest(store, [data_dir / "nf9-data.pcap", data_dir / "nf9-template.pcap"])
    assert again.count("skipped") == 2 and store.count("flow") == 21  # held data never decodes twice


def test_staged_state_is_adopted_only_when_its_entry_committed(tmp_path):
    store = Store(tmp_path / "st")
    d = tmp_path / "st" / template_state.STATE_DIR / "job=fabric"
    d.mkdir(parents=True)
    (d / template_state.STATE_FILE).write_text(json.dumps({"version": 1, "templates": [], "held": []}))
    dec = FlowDecoder()
    dec.feed(_nf9_templates(False), EXPORTER, 0)
    staged = template_state.export_state(dec)
    (d / "staged-never-committed.json").write_text(json.dumps(staged))
    with template_state.session(store):
        assert template_state.new_decoder().templates == {}  # the uncommitted stage was dropped
    assert not (d / "staged-never-committed.json").exists()
    key = store.manifest_key("0" * 64, "x")
    from rankscope.collectors.store import ManifestEntry

    store.add_manifest(ManifestEntry(key=key, source="s", format="flow_pcap", job="fabric", sha256="0" * 64))
    (d / f"staged-{key}.json").write_text(json.dumps(staged))
    with template_state.session(store):
        assert len(template_state.new_decoder().templates) == 1  # committed: adopted


def test_held_data_is_bounded_per_store_and_overflow_is_counted(tmp_path):
    """Data whose template never comes: at most MAX_HELD_BYTES are kept, the rest is counted."""
    rec = _record(0) * 40  # 1,240-byte data sets
    grams, sets = [], 0
    for f in range(2):
        grams = [(T0 + 3000 * f + i, ipfix_message([data_set(256, [rec])], domain=7, export_s=T0 + 3000 * f + i))
                 for i in range(2500)]
        sets += len(grams)
        _write_pcap(tmp_path / f"d{f}.pcap", grams)
    store = Store(tmp_path / "st")
    summary = ingest(store, [tmp_path / "d0.pcap", tmp_path / "d1.pcap"])
    full = summary.rejects["ipfix: data set for an unknown template (waiting buffer full)"]
    state = json.loads((tmp_path / "st" / template_state.STATE_DIR / "job=fabric" / template_state.STATE_FILE).read_text())
    held = len(state["held"])
    assert held + full == sets
    assert held * held_cost(b"x" * (len(rec) + 0)) <= template_state.MAX_HELD_BYTES
    assert full > 0


def test_empty_data_sets_count_against_the_bound():
    dec = FlowDecoder(max_waiting_bytes=10_000)
    empty = ipfix_message([struct.pack(">HH", 256, 4)] * 50, domain=1)
    for _ in range(100):
        dec.feed(empty, EXPORTER, 0)
    assert dec.waiting_bytes <= 10_000
    assert dec.rejects["ipfix: data set for an unknown template (waiting buffer full)"] == 5000 - dec.held_sets


def test_held_data_stays_with_its_capture(tmp_path):
    """A template ingested into another --job (another capture) does not decode this capture's held data."""
    data_dir = Path(__file__).parents[2] / "data" / "goflow2"
    store = Store(tmp_path / "st")
    from rankscope.collectors.importers.contract import ImportOptions

    ingest(store, [data_dir / "nf9-data.pcap"], opts=ImportOptions(job="capA"))
    ingest(store, [data_dir / "nf9-template.pcap"], opts=ImportOptions(job="capB"))
    assert store.count("flow") == 0
    ingest(store, [data_dir / "nf9-template.pcap"], opts=ImportOptions(job="capA"))
    assert store.count("flow", "capA") == 21 and store.count("flow", "capB") == 0


def test_capture_order_sorts_flow_captures_in_their_slots(tmp_path):
    paths, _ = _rotation(tmp_path, "ipfix", False, files=4, every=1, first=0, msgs=1)
    other = tmp_path / "notes.txt"
    other.write_text("x")
    mixed = [paths[0], other, paths[2], paths[1], paths[3]]
    ordered = template_state.capture_order(mixed)
    assert ordered[1] == other
    assert [p for p in ordered if p != other] == paths
