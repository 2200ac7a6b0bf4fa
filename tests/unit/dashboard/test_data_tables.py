"""Tables summarise long evidence in the cell, keep the full text as a tooltip, and never cut headers."""

from __future__ import annotations

from rankscope.analysis.report.findings import Finding, Worker
from rankscope.dashboard.data_tables import cell_text, data_table, findings_rows, table_rows


def test_group_lists_are_counted_not_dumped():
    groups = [list(range(i * 64, i * 64 + 64)) for i in range(32)]
    text = cell_text(groups)
    assert text.startswith("32 groups: [0,1,2,3,..]") and len(text) <= 60
    assert cell_text(list(range(100))) == "0, 1, 2, 3, 4, 5 ... (100 in all)"


def test_full_value_goes_to_the_tooltip():
    rows = [{"aspect": "groups", "evidence": {"baseline": [[0, 1], [2, 3]], "current": [[0, 2], [1, 3]]},
             "ratio": 1.2345678}]
    cols, data, tips, total = table_rows(rows)
    assert cols == ["aspect", "evidence", "ratio"] and total == 1
    assert data[0]["ratio"] == "1.235"
    assert "evidence" not in tips[0] or "[0, 2]" in tips[0]["evidence"]["value"]
    long = [{"reason": "x" * 300}]
    _, data, tips, _ = table_rows(long)
    assert len(data[0]["reason"]) == 60 and tips[0]["reason"]["value"] == "x" * 300


def test_table_headers_wrap_and_have_help():
    head, table = data_table("t", [{"group_ranks": [0, 1], "missing": [1]}], "Hangs", "none")
    assert table.style_header["whiteSpace"] == "normal"
    assert [c["name"] for c in table.columns] == ["group ranks", "missing"]
    assert "never joined" in table.tooltip_header["missing"]
    assert data_table("t", [], "Hangs", "no hangs found")[1].children == "no hangs found"


def test_findings_rows_use_the_analysis_words():
    f = Finding(kind="slow_worker", culprit=Worker(5, 1, 2), factor=1.6, steps=[0, 1], evidence={"basis": "compute"})
    (row,) = findings_rows([f])
    assert row["finding"].startswith("rank 5 (stage 1, dp 2) computes 1.60x")
