"""collectors.ingest.staged without Ray: a file staged by one process is invisible and survives other
writers until its commit, which equals the serial ingest; a decode that needs earlier files' template state
is handed back to the serial path; abandoned staging areas are removed, running ones kept."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from rankscope.collectors.flows import flow_importers
from rankscope.collectors.importers import contract
from rankscope.collectors.ingest import staged
from rankscope.collectors.ingest.files import ingest, ingest_file
from rankscope.collectors.store import Store
from tests.unit.collectors.flow_builders import data_set, ipfix_message, template_set, u, v4

TEMPLATE = [(8, 4), (12, 4), (152, 8), (153, 8), (1, 8), (2, 8)]


def _file(path: Path, domain: int, n: int, with_template: bool = True, t0: int = 1_700_000_000_000,
          per_message: int = 4) -> Path:
    recs = [v4(f"10.9.{i}.1") + v4("10.9.0.2") + u(t0 + i, 8) + u(t0 + i + 5, 8) + u(100 + i, 8) + u(1, 8)
            for i in range(n)]
    msgs = [ipfix_message(([template_set({260: TEMPLATE})] if with_template and i == 0 else [])
                          + [data_set(260, recs[i:i + per_message])], domain=domain, export_s=t0 // 1000)
            for i in range(0, n, per_message)]
    path.write_bytes(b"".join(msgs))
    return path


def _stage(store: Store, path: Path, area: Path) -> staged.Staged:
    return staged.stage_file(str(store.root), str(path), "auto", contract.ImportOptions(), contract.Limits(),
                             str(area / path.stem))


def test_staged_parts_are_invisible_and_survive_another_writer_until_the_commit(tmp_path):
    store = Store(tmp_path / "st")
    f1, f2 = _file(tmp_path / "a.ipfix", 1, 20), _file(tmp_path / "b.ipfix", 2, 7)
    with staged.staging_area(store) as area:
        st = _stage(store, f1, area)
        assert st.result.status == "staged" and st.parts
        # another writer commits meanwhile; its first lock cleans orphans: the staged parts are none of them
        assert ingest_file(Store(store.root), f2).status == "ingested"
        assert Store(store.root).read("flow").height == 7
        res = staged.commit_staged(store, st, contract.ImportOptions())
        assert res is not None and res.status == "ingested" and res.records == {"flow": 20}
    assert Store(store.root).read("flow").height == 27
    serial = Store(tmp_path / "serial")
    ingest(serial, [f1, f2])
    a, b = serial.read("flow"), Store(store.root).read("flow")
    assert a.sort(a.columns).equals(b.sort(b.columns))
    assert not list((store.root / staged.STAGED_DIR).iterdir())


def test_a_task_gathers_batches_into_parts_of_part_rows_same_rows(tmp_path, monkeypatch):
    f = _file(tmp_path / "a.ipfix", 1, 20)
    monkeypatch.setattr(flow_importers, "CHUNK_RECORDS", 4)  # batches of about 4 records
    monkeypatch.setattr(staged, "PART_ROWS", 10)
    store, serial = Store(tmp_path / "st"), Store(tmp_path / "serial")
    with staged.staging_area(store) as area:
        st = _stage(store, f, area)
        assert staged.commit_staged(store, st, contract.ImportOptions()).records == {"flow": 20}
    assert ingest_file(serial, f).records == {"flow": 20}
    assert 2 <= len(store.parts("flow")) < len(serial.parts("flow"))
    a, b = serial.read("flow"), store.read("flow")
    assert a.equals(b)  # the same rows in the same order, in fewer parts


def test_a_file_needing_an_earlier_template_goes_the_serial_way(tmp_path):
    store = Store(tmp_path / "st")
    first, later = _file(tmp_path / "a.ipfix", 5, 3), _file(tmp_path / "b.ipfix", 5, 4, with_template=False)
    with staged.staging_area(store) as area:
        st_first, st_later = _stage(store, first, area), _stage(store, later, area)
        assert st_later.result.records == {} and st_later.state["held"]  # held: no template of its own
        assert staged.commit_staged(store, st_first, contract.ImportOptions()).status == "ingested"
        assert staged.commit_staged(store, st_later, contract.ImportOptions()) is None
        assert not (area / "b").exists()  # its staged work is dropped
    assert ingest_file(store, later).records == {"flow": 4}  # what the caller then does


def test_abandoned_staging_areas_are_removed_running_ones_kept(tmp_path):
    store = Store(tmp_path / "st")
    base = store.root / staged.STAGED_DIR
    dead, alive = base / "dead", base / "alive"
    for d in (dead, alive):
        (d / "flow").mkdir(parents=True)
        (d / staged.LOCK_NAME).touch()
    fd = os.open(alive / staged.LOCK_NAME, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with staged.staging_area(store) as area:
            assert area.is_dir() and alive.is_dir() and not dead.exists()
    finally:
        os.close(fd)
    assert "dead\tstaged parts" in (store.root / "_removed.log").read_text()


def test_a_run_that_died_before_naming_its_area_leaves_nothing_once_it_is_old(tmp_path):
    """A run killed between creating ``.new-<run>`` and locking it: removed once older than the grace
    period; a young one may be a live run about to lock it, and stays."""
    store = Store(tmp_path / "st")
    base = store.root / staged.STAGED_DIR
    old, young = base / ".new-old", base / ".new-young"
    for d in (old, young):
        d.mkdir(parents=True)
    long_ago = time.time() - staged.NEW_AREA_GRACE_S - 60
    os.utime(old, (long_ago, long_ago))
    with staged.staging_area(store):
        assert not old.exists() and young.is_dir()
    assert ".new-old\tstaged parts" in (store.root / "_removed.log").read_text()
