"""An unreadable flow-template state is a warning naming the file, kept aside, and a capture whose data
needs a template nobody has says that its flows are held, not stored (issue 41)."""

from __future__ import annotations

from rankscope.collectors.flows import template_state
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store
from tests.unit.collectors.test_flow_templates_across_files import _rotation


def test_an_unreadable_state_is_named_and_the_held_data_is_said(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    paths, _ = _rotation(src, "ipfix", False, files=2, every=9, first=0)
    first, second = paths  # capture order: the first holds the templates
    store = Store(tmp_path / "st")
    r = ingest(store, [first]).files[0]
    assert r.status == "ingested" and not r.warnings
    state = tmp_path / "st" / template_state.STATE_DIR / "job=fabric" / template_state.STATE_FILE
    state.write_bytes(b'{"version": 1, "templ')  # cut short
    r = ingest(store, [second]).files[0]
    assert any(str(state) in w and "unreadable" in w for w in r.warnings), r.warnings
    assert any("need a template no file has sent" in w and "held" in w for w in r.warnings), r.warnings
    kept = list(state.parent.glob("state.json.unreadable-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == b'{"version": 1, "templ'
    # held, not marked done: nothing stored, and a retry is held again (not skipped) while the state is lost
    assert r.status == "failed" and "not marked ingested" in r.error and store.count("flow") == 12  # first's
    again = ingest(store, [second]).files[0]
    assert again.status == "failed" and "not marked ingested" in again.error
    # the user lets the data wait (removes the kept state): it is held in the state, and a later template
    # file stores it
    kept[0].unlink()
    assert ingest(store, [second]).files[0].status == "ingested" and store.count("flow") == 12
    later = tmp_path / "later"
    later.mkdir()
    paths2, _ = _rotation(later, "ipfix", False, files=1, every=9, first=0, msgs=1, per_msg=1)
    ingest(store, paths2)
    assert store.count("flow") == 12 + 12 + 1
