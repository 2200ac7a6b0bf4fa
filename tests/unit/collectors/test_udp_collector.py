"""The live UDP collector: decode, roll, count malformed datagrams, flush everything on stop/SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rankscope.collectors.errors import ConfigError
from rankscope.collectors.flows import flow_files
from rankscope.collectors.flows.flow_decoder import FlowDecoder
from rankscope.collectors.flows.udp_collector import CollectorConfig, FlowCollector, parse_listen
from rankscope.collectors.store import Store
from tests.unit.collectors.flow_builders import data_set, ipfix_message, template_set, u, v4

FIXTURES = Path(__file__).parent / "fixtures"
FIELDS = [(8, 4), (12, 4), (1, 4), (2, 4), (152, 8)]


def _messages(n_msgs: int, per_msg: int = 20) -> list[bytes]:
    tmpl = template_set({256: FIELDS})
    out = []
    for m in range(n_msgs):
        recs = [v4("10.0.0.1") + v4(f"10.0.{m % 200}.{i % 250 + 1}") + u(100 + i, 4) + u(1, 4)
                + u(1_700_000_000_000 + m, 8) for i in range(per_msg)]
        out.append(ipfix_message(([tmpl] if m == 0 else []) + [data_set(256, recs)], seq=m))
    return out


def _run_in_thread(tmp_path, **kw):
    cfg = CollectorConfig(listen=(("127.0.0.1", 0),), store=str(tmp_path / "st"), **kw)
    coll = FlowCollector(cfg)
    (_, port), = coll.open()
    th = threading.Thread(target=coll.run, daemon=True)
    th.start()
    return coll, th, port


def test_collects_softflowd_export_and_counts_garbage(tmp_path):
    coll, th, port = _run_in_thread(tmp_path, roll_seconds=0.2)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dec = FlowDecoder()
    for payload, _, _ in flow_files.capture_datagrams(FIXTURES / "softflowd_ipfix.pcap", dec):
        s.sendto(payload, ("127.0.0.1", port))
    s.sendto(b"\x00\x0a\x00\x05junk", ("127.0.0.1", port))
    s.sendto(b"hello", ("127.0.0.1", port))
    time.sleep(0.5)
    coll.stop()
    th.join(10)
    store = Store(tmp_path / "st")
    assert store.count("flow", "fabric") == 11
    rej = coll.all_rejects
    assert rej["ipfix: message shorter than its 16-byte header"] == 1
    assert rej["unknown export protocol version"] == 1
    entry = [m for m in store.manifest() if m.format == "collect-flows"][0]
    assert entry.records == {"flow": 11} and entry.notes["datagrams"] == 5
    assert entry.notes["kernel_drops"] == 0
    assert entry.samples["unknown export protocol version"] == b"hello".hex()


def test_rolls_parts_by_record_count(tmp_path):
    coll, th, port = _run_in_thread(tmp_path, roll_records=100, roll_seconds=60)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for m in _messages(30):
        s.sendto(m, ("127.0.0.1", port))
    time.sleep(0.5)
    coll.stop()
    th.join(10)
    store = Store(tmp_path / "st")
    assert store.count("flow") == 600
    assert len(store.parts("flow")) >= 6  # 600 records, at most ~100 buffered per part


def test_sigterm_flushes_everything_received(tmp_path):
    """A tiny burst, then SIGTERM right away: every record sent must be in the store (0 lost)."""
    store_dir = tmp_path / "st"
    proc = subprocess.Popen([sys.executable, "-m", "rankscope.cli.main", "collect", "flows", "--listen",
                             "127.0.0.1:0", "--store", str(store_dir), "--roll-seconds", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert "listening on udp 127.0.0.1:" in line, line + proc.stdout.read()
    port = int(line.split("127.0.0.1:")[1].split()[0])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    msgs = _messages(500)
    for m in msgs:
        s.sendto(m, ("127.0.0.1", port))
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    entry = [m for m in Store(store_dir).manifest() if m.format == "collect-flows"][0]
    drops = entry.notes["kernel_drops"]
    assert Store(store_dir).count("flow") + 20 * drops == 500 * 20, out
    assert drops == 0, f"kernel dropped {drops} datagrams of a 500-datagram burst"


def test_sigterm_right_after_listening_is_handled(tmp_path):
    """The handlers are in place before the collector says it listens: a SIGTERM sent the moment
    that line appears stops it cleanly (exit 0, manifest written), never kills it."""
    for i in range(5):
        store_dir = tmp_path / f"st{i}"
        proc = subprocess.Popen([sys.executable, "-m", "rankscope.cli.main", "collect", "flows", "--listen",
                                 "127.0.0.1:0", "--store", str(store_dir)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = proc.stdout.readline()
        assert "listening on udp" in line, line
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, (proc.returncode, out)
        assert [m for m in Store(store_dir).manifest() if m.format == "collect-flows"], out


def test_config_validation():
    with pytest.raises(ConfigError):
        CollectorConfig(listen=(), store="x")
    with pytest.raises(ConfigError):
        CollectorConfig(listen=(("0.0.0.0", 70000),), store="x")
    with pytest.raises(ConfigError):
        CollectorConfig(listen=(("0.0.0.0", 1),), store="x", roll_records=0)
    with pytest.raises(ConfigError):
        parse_listen("4739")
    assert parse_listen("[::]:4739") == ("::", 4739)
    assert parse_listen(":6343") == ("0.0.0.0", 6343)


def test_bind_failure_is_a_clear_error(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        coll = FlowCollector(CollectorConfig(listen=(("127.0.0.1", port),), store=str(tmp_path)))
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
            coll.open()


def _until(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.02)
    return cond()


def test_templates_outlive_a_collector_restart(tmp_path):
    """A restarted collector decodes data whose template the previous run received (kept in the store)."""
    msgs = _messages(4)  # the template rides in the first message only
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    coll, th, port = _run_in_thread(tmp_path, roll_seconds=0.2)
    s.sendto(msgs[0], ("127.0.0.1", port))
    assert _until(lambda: coll.stats.datagrams >= 1)
    coll.stop()
    th.join(10)
    coll, th, port = _run_in_thread(tmp_path, roll_seconds=0.2)
    for m in msgs[1:]:
        s.sendto(m, ("127.0.0.1", port))
    assert _until(lambda: coll.stats.datagrams >= 3)
    coll.stop()
    th.join(10)
    assert not coll.all_rejects, coll.all_rejects
    assert Store(tmp_path / "st").count("flow", "fabric") == 4 * 20
