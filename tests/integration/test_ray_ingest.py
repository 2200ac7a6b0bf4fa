"""rankscope ingest --engine ray: each file decoded and written by a Ray task, committed by the driver in
the serial ingest's order, stores what the serial ingest stores: the same rows per kind, manifest entries,
rejects (with their samples), messages and flow template state; and analyze reads equal reports from both. Trace dumps (Kineto, OSDI'25, CSV) too.

Inputs: two real IPFIX captures of the outside validation corpus (../shared/validation, read in place),
which share observation domains (the second is still decoded ahead: it sends every template before the
data that use it), and hand-built IPFIX files of an exporter of their own: one with bad records (a port beyond its
column, a truncated last message) and good ones, its byte copy under another name (skipped, as already
in the store), and a later file of the same exporter whose data comes before its template refresh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.schema import SCHEMAS
from rankscope.collectors.store import Store
from tests.unit.collectors.flow_builders import data_set, ipfix_message, template_set, u, v4

pytest.importorskip("ray")
BIN = Path(sys.executable).parent
VALIDATION = (Path(__file__).resolve().parents[2] / ".." / "shared" / "validation" / "flows").resolve()
REAL = [VALIDATION / "V3-128-pure-pp" / "flows.ipfix", VALIDATION / "V4-256-pure-dp" / "flows.ipfix"]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not all(p.is_file() for p in REAL), reason="../shared/validation is not present")]
TEMPLATE = [(8, 4), (12, 4), (152, 8), (153, 8), (1, 8), (2, 8), (7, 4), (11, 2), (4, 1)]
DOMAIN = 4242


def _record(i: int, t_ms: int, sport: int | None = None) -> bytes:
    return (v4(f"192.168.{i % 7}.1") + v4(f"192.168.{i % 5}.2") + u(t_ms, 8) + u(t_ms + 3, 8) + u(900 + i, 8)
            + u(1 + i % 3, 8) + u(40000 + i if sport is None else sport, 4) + u(4791, 2) + u(17, 1))


def _write_inputs(d: Path) -> list[Path]:
    t0 = 1_700_000_000_000
    bad = [ipfix_message([template_set({300: TEMPLATE}),
                          data_set(300, [_record(i, t0 + i) for i in range(40)]
                                   + [_record(99, t0, sport=0xFFFFFFFF)])], domain=DOMAIN, export_s=t0 // 1000)]
    bad.append(ipfix_message([data_set(300, [_record(i, t0 + 50 + i) for i in range(10)])],
                             domain=DOMAIN, export_s=t0 // 1000 + 1)[:-7])  # the last message cut short
    (d / "bad.ipfix").write_bytes(b"".join(bad))
    (d / "bad-copy.ipfix").write_bytes(b"".join(bad))
    # rotated: its data precede the template refresh, so the template state the bad file left is needed
    later = t0 + 60_000
    rotated = [ipfix_message([data_set(300, [_record(i, later + i) for i in range(25)])], domain=DOMAIN,
                             export_s=later // 1000),
               ipfix_message([template_set({300: TEMPLATE}), data_set(300, [_record(7, later + 30)])],
                             domain=DOMAIN, export_s=later // 1000 + 1)]
    (d / "rotated.ipfix").write_bytes(b"".join(rotated))
    # tail: data only, decodable with the templates earlier files sent alone
    (d / "tail.ipfix").write_bytes(ipfix_message([data_set(300, [_record(i, later + 90_000 + i) for i in range(9)])],
                                                 domain=DOMAIN, export_s=later // 1000 + 90))
    return [*REAL, d / "bad.ipfix", d / "bad-copy.ipfix", d / "rotated.ipfix", d / "tail.ipfix"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    return _write_inputs(tmp_path_factory.mktemp("ray-ingest-in"))


def test_which_ipfix_files_decode_alike_after_any_earlier_file(inputs):
    from rankscope.collectors.flows.flow_files import ipfix_file_self_contained

    v3 = ipfix_file_self_contained(REAL[0])
    assert v3 and v3 == ipfix_file_self_contained(REAL[1])  # each leaf's templates first, in both
    assert ipfix_file_self_contained(inputs[2]) is None  # bad.ipfix: its last message is cut short
    assert ipfix_file_self_contained(inputs[-2]) == ipfix_file_self_contained(inputs[-1]) == set()


def _rows(store: Store) -> dict[str, pl.DataFrame]:
    out = {}
    for kind in SCHEMAS:
        df = store.read(kind)
        out[kind] = df.sort(df.columns, nulls_last=True)
    return out


def _manifest(store: Store) -> dict[str, dict]:
    keep = ("source", "format", "job", "sha256", "records", "rejects", "samples", "relative_time", "notes")
    # parts: named afresh, and a task gathers batches into parts of up to staged.PART_ROWS rows (fewer parts)
    return {m.key: {k: getattr(m, k) for k in keep} | {"parts": bool(m.parts)} for m in store.manifest()}


def _results(summary) -> list[tuple]:
    return [(f.path, f.status, f.format, f.records, dict(f.rejects), f.warnings, f.error) for f in summary.files]


def _state(root: Path) -> dict:
    return json.loads((root / "_flow_templates" / "job=fabric" / "state.json").read_text())


def _run(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([str(BIN / "rankscope"), *args], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _reports(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_analyze_ingest_on_ray_gives_the_serial_reports(inputs, tmp_path):
    files = [str(p) for p in (REAL[0], *inputs[2:])]
    ing = [a for f in files for a in ("--ingest", f)]
    _run("analyze", *ing, "--store", str(tmp_path / "a"), "--out-dir", str(tmp_path / "ra"), "--no-html")
    r = _run("analyze", *ing, "--store", str(tmp_path / "b"), "--out-dir", str(tmp_path / "rb"), "--no-html",
             "--engine", "ray")
    assert "2 flow file(s) ingested one after another" in r.stderr
    _run("ingest", *files, "--store", str(tmp_path / "c"), "--engine", "ray", "-q")
    _run("analyze", "--store", str(tmp_path / "c"), "--out-dir", str(tmp_path / "rc"), "--no-html")
    serial, on_ray, ingested = _reports(tmp_path / "ra"), _reports(tmp_path / "rb"), _reports(tmp_path / "rc")
    assert serial and sorted(serial) == sorted(on_ray) == sorted(ingested)
    for job, rep in serial.items():
        assert rep == on_ray[job] == ingested[job], job


@pytest.fixture(scope="module")
def cluster():
    from rankscope.analysis.runner import ray_session

    with ray_session(num_cpus=2):  # a local cluster for the module's in-process tests, gone with the block
        yield


def test_ray_ingest_stores_what_the_serial_ingest_stores(inputs, tmp_path, cluster):
    from rankscope.analysis.runner import RayMapper, ingest_with_ray

    serial = ingest(Store(tmp_path / "serial"), inputs)
    mapper = RayMapper()
    shown = []

    def progress(items, total):  # the CLI's bar: one item per file's commit, its total known up front
        shown.append(total)
        for item in items:
            shown.append(item[0].file)
            yield item

    on_ray = ingest_with_ray(str(tmp_path / "ray"), inputs, mapper=mapper, progress=progress)
    assert shown == [len(inputs), *[f.path for f in on_ray.summary.files]]
    again = ingest_with_ray(str(tmp_path / "ray"), inputs, mapper=mapper)
    a, b = Store(tmp_path / "serial"), Store(tmp_path / "ray")
    assert _results(on_ray.summary) == _results(serial)
    # capture order (export times): the hand-built files (the copy's name first), then V3, V4
    assert [f.status for f in serial.files] == ["ingested", "skipped", "ingested", "ingested", "ingested", "ingested"]
    bad = serial.files[0]
    assert bad.records == {"flow": 40} and sum(bad.rejects.values()) == 2, bad.rejects
    # the rotated and tail files need the bad file's template: each ingested in order. V4 shares V3's
    # observation domains, but sends each template before its data: decoded ahead, as V3 was
    assert on_ray.in_order == [str(inputs[-2]), str(inputs[-1])]
    # every file ran in a task: the staged decode of each, and a serial ingest of the two in order
    assert sorted(fn for fn, *_ in mapper.peaks[:8]) == ["_ingest_serially"] * 2 + ["_stage"] * 6
    rows_a, rows_b = _rows(a), _rows(b)
    for kind in SCHEMAS:
        assert rows_a[kind].equals(rows_b[kind]), kind
    assert rows_a["flow"].height == 11_349 + 16_384 + 40 + 26 + 9
    assert _manifest(a) == _manifest(b)
    assert any("message length runs past" in r for m in _manifest(a).values() for r in m["samples"])
    assert _state(a.root) == _state(b.root)
    assert not any((b.root / "_staged").iterdir())  # the staging area is gone with the run
    assert all(f.status == "skipped" for f in again.summary.files)


def test_trace_dumps_on_ray_store_what_the_serial_ingest_stores(reference_dir, repo_root, tmp_path, cluster):
    """Not only flows: Kineto dumps, OSDI'25 traces (meta companions, fingerprinted sources) and CSVs."""
    from rankscope.analysis.runner import ingest_with_ray

    paths = [reference_dir / "kineto-hta", reference_dir / "stragglers-osdi25", repo_root / "datasets/samples/demo"]
    serial = ingest(Store(tmp_path / "serial"), paths)
    on_ray = ingest_with_ray(str(tmp_path / "ray"), paths)
    assert _results(on_ray.summary) == _results(serial) and serial.count("ingested") > 5
    assert on_ray.in_order == []
    a, b = Store(tmp_path / "serial"), Store(tmp_path / "ray")
    rows_a, rows_b = _rows(a), _rows(b)
    for kind in SCHEMAS:
        assert rows_a[kind].equals(rows_b[kind]), kind
    assert rows_a["comm_op"].height and rows_a["compute_op"].height
    assert _manifest(a) == _manifest(b)
    assert sorted(p.name for p in a.manifest_dir().glob("*.alias")) == \
        sorted(p.name for p in b.manifest_dir().glob("*.alias"))
