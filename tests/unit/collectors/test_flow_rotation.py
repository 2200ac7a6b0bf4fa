"""Templates outlive files: rotated collector files, where most data files hold no template, decode
every data record, within one ingest and across ingests into the same store (as nfcapd keeps them)."""

from __future__ import annotations

import json

import dpkt

from rankscope.collectors import formats
from rankscope.collectors.flows.template_state import STATE_DIR, STATE_FILE
from rankscope.collectors.ingest import ingest
from rankscope.collectors.store import Store
from tests.unit.collectors.flow_builders import (
    data_set,
    ethernet_ipv4_udp,
    ipfix_message,
    nf9_options_template,
    nf9_packet,
    nf9_template,
    template_set,
    u,
    v4,
)

BASIC = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]
T0_MS = 1_700_000_000_000


def _rec(i: int) -> bytes:
    return (v4("10.0.0.1") + v4(f"10.0.1.{i % 250 + 1}") + u(1000 + i, 2) + u(4791, 2) + u(17, 1)
            + u(1500 + i, 8) + u(3, 8) + u(T0_MS + i, 8) + u(T0_MS + i + 5, 8))


def _ingest(store: Store, *paths):
    return ingest(store, paths, opts=formats.ImportOptions(job="fabric"))


def _flows(store: Store):
    return store.read("flow", job="fabric")


def test_rotated_ipfix_files_decode_every_record(tmp_path):
    """nfcapd-style rotation: the template comes in the first file and in a refresh two files later."""
    d = tmp_path / "rot"
    d.mkdir()
    files, n = [], 0
    for k in range(5):
        sets = [template_set({256: BASIC})] if k in (0, 3) else []
        sets.append(data_set(256, [_rec(n + j) for j in range(4)]))
        n += 4
        p = d / f"nfcapd.2026120306{k:02d}.ipfix"
        p.write_bytes(ipfix_message(sets, seq=k))
        files.append(p)
    store = Store(tmp_path / "st")
    s = _ingest(store, *files)
    assert [f.status for f in s.files] == ["ingested"] * 5, [f.error for f in s.files]
    assert not s.rejects, s.rejects
    assert _flows(store).height == n == 20


def test_data_before_its_template_is_held_and_decoded_with_the_next_file(tmp_path):
    data = tmp_path / "a-data.ipfix"
    data.write_bytes(ipfix_message([data_set(256, [_rec(i) for i in range(4)])]))
    tmpl = tmp_path / "b-template.ipfix"
    tmpl.write_bytes(ipfix_message([template_set({256: BASIC}), data_set(256, [_rec(9)])]))
    store = Store(tmp_path / "st")
    s = _ingest(store, data, tmpl)
    assert not s.rejects, s.rejects
    assert _flows(store).height == 5
    assert sorted(_flows(store)["size_bytes"].to_list()) == [1500, 1501, 1502, 1503, 1509]


def test_templates_are_kept_in_the_store_for_the_next_ingest(tmp_path):
    store = Store(tmp_path / "st")
    first = tmp_path / "t.ipfix"
    first.write_bytes(ipfix_message([template_set({256: BASIC}), data_set(256, [_rec(0)])]))
    assert not _ingest(store, first).rejects
    state = json.loads((tmp_path / "st" / STATE_DIR / STATE_FILE).read_text())
    assert state["templates"] and state["templates"][0][2] == 256
    later = tmp_path / "later.ipfix"
    later.write_bytes(ipfix_message([data_set(256, [_rec(i) for i in range(1, 7)])], seq=1))
    s = _ingest(store, later)  # a new command: only the store remembers the template
    assert not s.rejects, s.rejects
    assert _flows(store).height == 7


def test_netflow9_pcaps_with_sampling_options_in_another_file(tmp_path):
    """softflowd/router style: template and sampling options in one capture, data in the next."""
    fields = [(8, 4), (12, 4), (1, 4), (2, 4), (22, 4), (21, 4)]
    opts = nf9_options_template(300, [(1, 4)], [(34, 4), (49, 1)])
    opt_data = data_set(300, [u(0xDEAD, 4) + u(100, 4) + u(2, 1)], pad_to=4)

    def rec(i):
        return v4("10.0.0.1") + v4("10.0.0.2") + u(1000 + i, 4) + u(4, 4) + u(1, 4) + u(2, 4)

    def write(path, packets):
        with open(path, "wb") as f:
            w = dpkt.pcap.Writer(f, linktype=dpkt.pcap.DLT_EN10MB)
            for i, p in enumerate(packets):
                w.writepkt(ethernet_ipv4_udp("198.51.100.1", "192.0.2.2", 2055, 9995, p), 1_700_000_000 + i)

    a, b = tmp_path / "export-1.pcap", tmp_path / "export-2.pcap"
    write(a, [nf9_packet([opts, opt_data, nf9_template({260: fields})], 10_000, 1_700_000_000)])
    write(b, [nf9_packet([data_set(260, [rec(i) for i in range(3)])], 11_000, 1_700_000_001)])
    store = Store(tmp_path / "st")
    s = _ingest(store, a, b)
    assert not s.rejects, s.rejects
    df = _flows(store)
    assert df.height == 3
    assert set(df["sampling_rate"].to_list()) == {100}
    assert sorted(df["est_size_bytes"].to_list()) == [100_000, 100_100, 100_200]


def test_held_data_never_exceeds_its_bound(tmp_path):
    # data for a template that never comes: held up to the bound, the rest counted, nothing raised
    big = tmp_path / "orphans.ipfix"
    msgs = [ipfix_message([data_set(999, [_rec(i) for i in range(300)])], seq=k) for k in range(1, 400)]  # 7 MB of data sets
    big.write_bytes(b"".join(msgs))
    store = Store(tmp_path / "st")
    s = _ingest(store, big)
    state = json.loads((tmp_path / "st" / STATE_DIR / STATE_FILE).read_text())
    held = sum(len(w[3]) // 2 for w in state["waiting"])
    assert 0 < held <= 4 << 20
    assert s.rejects.get("ipfix: data set for an unknown template (waiting buffer full)", 0) > 0
