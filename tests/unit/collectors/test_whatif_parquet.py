"""The OSDI'25 trace importer: layout from meta-<X>.yaml, op type mapping, rejects by reason."""

from __future__ import annotations

import polars as pl
import pytest

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers import contract
from rankscope.collectors.importers.osdi_whatif import WHATIF_PARQUET, read_layout
from rankscope.collectors.ingest import registry
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store

META = "trial_name: TINY\nrun_id: 0\ndp_size: 1\ndsp_size: 1\npp_size: 2\ntp_size: 1\nvpp_size: 1\nworld_size: 2\n"


def tiny_trace(path, extra_rows=()):
    """One step of a 2-stage pipeline, 2 microbatches, GPipe-like order (seconds, per-step relative)."""
    rows = []
    t = {0: 0.0, 1: 0.0}

    def op(stage, optype, seq, mb, dur, at=None):
        start = t[stage] if at is None else at
        rows.append({"dp_rank": 0, "stage": stage, "rank": stage, "step": 5, "optype": optype,
                     "start_ts": start, "duration": dur, "seq_id": seq, "mc": 0 if mb >= 0 else -1,
                     "mb_id": mb, "gmc": stage if mb >= 0 else -1})
        t[stage] = start + dur

    for mb in range(2):
        op(0, "forward-compute", mb, mb, 0.10)
        op(0, "forward-send", mb, -1, 0.01)
        op(1, "forward-recv", mb, -1, 0.01, at=t[0] - 0.01)
        op(1, "forward-compute", mb, mb, 0.12)
    for mb in range(2):
        op(1, "backward-compute", mb, mb, 0.2)
        op(1, "backward-send", mb, -1, 0.01)
        op(0, "backward-recv", mb, -1, 0.01, at=max(t[0], t[1] - 0.01))
        op(0, "backward-compute", mb, mb, 0.18)
    for s in (0, 1):
        op(s, "gc", 0, 0, 0.0)
        op(s, "layernorm-grads-all-reduce", 0, -1, 0.001)
        op(s, "embedding-grads-all-reduce", 0, -1, 0.01, at=max(t.values()))
        op(s, "optimizer-clip-main-grad", 0, -1, 0.01)
        op(s, "optimizer", 0, -1, 0.03)
    rows.extend(extra_rows)
    df = pl.DataFrame(rows).with_columns(
        pl.col("dp_rank", "stage", "mc", "mb_id").cast(pl.Int8), pl.col("rank").cast(pl.Int16),
        pl.col("gmc").cast(pl.Int16), pl.col("seq_id").cast(pl.Int32),
        pl.col("start_ts", "duration").cast(pl.Float32), pl.col("optype").cast(pl.Categorical))
    df.write_parquet(path)
    return df


def test_reads_trace_and_meta_as_one_job(tmp_path):
    tiny_trace(tmp_path / "trace-TINY.parquet")
    (tmp_path / "meta-TINY.yaml").write_text(META)
    assert registry.detect(tmp_path / "trace-TINY.parquet") == "whatif_parquet"
    assert registry.is_companion(tmp_path / "meta-TINY.yaml")
    store = Store(tmp_path / "st")
    summary = ingest(store, [tmp_path])
    assert [f.status for f in summary.files] == ["ingested"]  # the yaml is not a file of its own
    assert store.jobs() == ["TINY"]
    comp = store.read("compute_op", "TINY")
    comm = store.read("comm_op", "TINY")
    assert sorted(comp["category"].unique().to_list()) == ["backward", "forward", "gc", "optimizer"]
    assert set(comm["op"].unique().to_list()) == {"send", "recv", "all_reduce"}
    assert comp.height + comm.height == 26
    # peers: forward-send of stage 0 goes to stage 1's rank
    fs = comm.filter(pl.col("optype") == "forward-send")
    assert fs["peer"].unique().to_list() == [1]
    assert comp["start_ns"].min() >= 0
    man = store.manifest()
    assert man[0].relative_time and man[0].notes["layout"]["pp_size"] == 2


def test_bad_rows_are_counted_good_rows_load(tmp_path):
    bad = [{"dp_rank": 0, "stage": 0, "rank": 0, "step": 5, "optype": "warp-drive", "start_ts": 0.0,
            "duration": 0.1, "seq_id": 0, "mc": 0, "mb_id": 0, "gmc": 0},
           {"dp_rank": 0, "stage": 0, "rank": 0, "step": 5, "optype": "optimizer", "start_ts": 0.0,
            "duration": -1.0, "seq_id": 1, "mc": -1, "mb_id": -1, "gmc": -1}]
    tiny_trace(tmp_path / "trace-X.parquet", extra_rows=bad)
    store = Store(tmp_path / "st")
    (res,) = ingest(store, [tmp_path / "trace-X.parquet"], opts=contract.ImportOptions(job="j")).files
    assert res.status == "ingested"
    assert res.rejects["whatif_parquet: unknown optype"] == 1
    assert res.rejects["whatif_parquet: negative duration"] == 1
    assert sum(res.records.values()) == 26
    assert store.jobs() == ["j"]


def test_missing_columns_and_bad_meta_name_the_file(tmp_path):
    pl.DataFrame({"rank": [0], "start_ts": [0.0]}).write_parquet(tmp_path / "trace-Y.parquet")
    assert not WHATIF_PARQUET.sniff(tmp_path / "trace-Y.parquet", b"PAR1")
    with pytest.raises(InputFormatError, match="trace-Y.parquet"):
        WHATIF_PARQUET.read(tmp_path / "trace-Y.parquet", contract.ImportOptions())
    (tmp_path / "meta-Y.yaml").write_text("dp_size: -2\n")
    with pytest.raises(InputFormatError, match="meta-Y.yaml"):
        read_layout(tmp_path / "meta-Y.yaml")


def test_a_trace_read_in_batches_stores_what_a_whole_read_stores(tmp_path, monkeypatch):
    """Past BATCH_ROWS rows the trace is decoded and stored a batch at a time; the rows, rejects (named by
    file row) and p2p peers equal a whole read's, with the time origin and the peer layout taken from the
    whole trace (here a negative start in the last batch, and a stage whose first rows lie in another
    batch)."""
    from rankscope.collectors.importers import osdi_whatif

    bad = [{"dp_rank": 0, "stage": 0, "rank": 0, "step": 5, "optype": "no-such-op", "start_ts": 0.5,
            "duration": 0.1, "seq_id": 9, "mc": -1, "mb_id": -1, "gmc": -1},
           {"dp_rank": 0, "stage": 1, "rank": 1, "step": 5, "optype": "gc", "start_ts": -0.25,
            "duration": 0.01, "seq_id": 9, "mc": 0, "mb_id": 0, "gmc": 1}]
    path = tmp_path / "trace-TINY.parquet"
    df = tiny_trace(path, extra_rows=bad)
    (tmp_path / "meta-TINY.yaml").write_text(META)

    def stored(batch_rows):
        monkeypatch.setattr(osdi_whatif, "BATCH_ROWS", batch_rows)
        store = Store(tmp_path / f"st-{batch_rows}")
        res = ingest(store, [path])
        return res, {k: store.read(k, "TINY") for k in ("comm_op", "compute_op")}

    whole_res, whole = stored(10**6)
    parts_res, parts = stored(7)
    assert not isinstance(WHATIF_PARQUET.read(path, contract.ImportOptions()), contract.ImportBatch)
    # a caller that keeps every row (analyze --ingest) gets it whole: batches would bound nothing there
    assert isinstance(WHATIF_PARQUET.read(path, contract.ImportOptions(rows_kept=True)), contract.ImportBatch)
    assert df.height > 3 * 7
    for kind in whole:
        cols = [c for c in whole[kind].columns if c != "source_file"]
        assert parts[kind].select(cols).equals(whole[kind].select(cols)), kind
    assert parts["comm_op"]["peer"].null_count() == whole["comm_op"]["peer"].null_count()
    assert whole["compute_op"]["start_ns"].min() == 0  # shifted by the last batch's negative start
    assert [r.rejects for r in parts_res.files] == [r.rejects for r in whole_res.files]


@pytest.mark.parametrize("text", [
    "trial_name: ST\nrun_id: 0\ndp_size: 2\ndsp_size: 1\npp_size: 4\ntp_size: 1\nvpp_size: 1\nworld_size: 8\n",
    "trial_name: AR-x16.v2\nworld_size: 128  \ndp_size:   16", "a: 1\na: 2\n",
    # left to yaml: what YAML reads otherwise than as an integer or a plain word, and anything not flat
    "dp_size: 010\n", "dp_size: 1_0\n", "dp_size: -2\n", "dp_size: 0x10\n", "dp_size: 1e3\n", "dp_size: 2.0\n",
    "trial_name: yes\n", "trial_name: Off\n", "trial_name: NULL\n", "on: 1\n", "trial_name: ~\n", "pp_size:\n",
    "trial_name: 'ST'\n", "# meta\ndp_size: 2\n", "dp_size: 2 # two\n", "\n", "", "---\ndp_size: 2\n",
    "dp_size: 2\n\npp_size: 4\n", "dp_size: 2\r\n", "layout:\n  dp_size: 2\n", "- 1\n", "dp_size:\t2\n",
])
def test_flat_meta_files_read_as_yaml_reads_them(text):
    import yaml

    from rankscope.collectors.importers.osdi_whatif import flat_mapping

    fast = flat_mapping(text)
    assert fast is None or fast == yaml.safe_load(text)
    if fast is not None:
        assert [type(v) for v in fast.values()] == [type(v) for v in yaml.safe_load(text).values()]


def test_reference_meta_files_take_the_flat_path(reference_dir):
    import yaml

    from rankscope.collectors.importers.osdi_whatif import flat_mapping

    metas = sorted((reference_dir / "stragglers-osdi25").glob("meta-*.yaml"))
    assert metas
    for meta in metas:
        assert flat_mapping(meta.read_text()) == yaml.safe_load(meta.read_text())


def test_widening_casts_lose_nothing_and_others_are_checked():
    import itertools

    from rankscope.collectors.importers.osdi_whatif import _BITS, _widens

    extremes = {pl.Int8: (-128, 127), pl.Int16: (-(2**15), 2**15 - 1), pl.Int32: (-(2**31), 2**31 - 1),
                pl.Int64: (-(2**63), 2**63 - 1), pl.UInt8: (0, 255), pl.UInt16: (0, 2**16 - 1),
                pl.UInt32: (0, 2**32 - 1), pl.UInt64: (0, 2**64 - 1), pl.Float32: (-3.4e38, float("inf")),
                pl.Float64: (-1.7e308, float("nan"))}
    for src, dst in itertools.product(_BITS, _BITS):
        s = pl.Series(list(extremes[src]), dtype=src)
        lost = bool(s.cast(dst, strict=False).is_null().any())
        assert not (_widens(src, dst) and lost), (src, dst)
    assert _widens(pl.Categorical, pl.String) and _widens(pl.Int8, pl.Int32) and _widens(pl.Float32, pl.Float64)
    assert not _widens(pl.Int32, pl.Int8) and not _widens(pl.Int8, pl.UInt64) and not _widens(pl.Int64, pl.Float64)
    assert not _widens(pl.String, pl.Int64)


@pytest.mark.parametrize("optype", [pl.Categorical, pl.String])
def test_op_types_as_categories_or_text_give_the_same_frames_in_one_chunk(tmp_path, optype):
    """The authors' traces store the op type as categories, which stay categories until the rows are split;
    text gives the same frames. A file of several row groups still gives each column in one chunk."""
    df = tiny_trace(tmp_path / "one.parquet")
    (tmp_path / "a").mkdir()
    df.with_columns(pl.col("optype").cast(optype)).write_parquet(tmp_path / "a" / "trace-TINY.parquet",
                                                                 row_group_size=5)
    expected = WHATIF_PARQUET.read(tmp_path / "one.parquet", contract.ImportOptions(job="j", rows_kept=True))
    got = WHATIF_PARQUET.read(tmp_path / "a" / "trace-TINY.parquet", contract.ImportOptions(job="j", rows_kept=True))
    assert set(got.tables) == {"compute_op", "comm_op"}
    for kind, (frame,) in got.tables.items():
        assert frame.schema["optype"] == pl.String
        assert all(n == 1 for n in frame.n_chunks("all")), kind
        assert frame.equals(expected.tables[kind][0]), kind
    assert got.tables["compute_op"][0]["optype"].to_list() == (
        df.filter(pl.col("optype").cast(pl.String).is_in(["forward-compute", "backward-compute", "gc", "optimizer"]))
        ["optype"].cast(pl.String).to_list())
