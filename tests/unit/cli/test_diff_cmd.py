import json

import polars as pl

from rankscope.cli.main import main
from rankscope.collectors.schema import conform
from rankscope.collectors.store import Store

from ..analysis.gemm_frames import gemm_frame


def _store(path, shapes, dur_ns, job="default"):
    st = Store(path)
    st.write("compute_op", conform(gemm_frame(shapes=shapes, ranks=2, dur_ns=dur_ns).with_columns(pl.lit(job).alias("job")),
                                   "compute_op"))
    return str(path)


def test_diff_prints_table_and_json(tmp_path, capsys):
    a = _store(tmp_path / "a", ((4096, 4096, 4096), (4096, 1024, 4096)), 1000)
    b = _store(tmp_path / "b", ((4096, 4096, 4096), (4096, 1000, 4096)), 1000, job="run2")
    out = tmp_path / "d.json"
    assert main(["diff", "--baseline", a, "--store", b, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "regression" in text and "N=1000" in text
    d = json.loads(out.read_text())
    assert d["job"] == "run2" and d["baseline_job"] == "default" and d["num_regressions"] >= 1


def test_diff_exit_codes(tmp_path, capsys):
    a = _store(tmp_path / "a", ((4096, 4096, 4096),), 1000)
    assert main(["diff", "--baseline", a, "--store", a, "--threshold", "0.8"]) == 0
    assert main(["diff", "--baseline", a, "--store", a, "--job", "nope"]) == 2
    assert main(["diff", "--baseline", a, "--store", a, "--threshold", "3"]) == 2
    assert main(["diff", "--store", a]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["diff", "--baseline", str(tmp_path / "empty"), "--store", a]) == 1
