"""The static report page: self-contained, escaped, with the key numbers and every figure."""

from __future__ import annotations

import re

import pytest
from plotly.offline import get_plotlyjs

from rankscope.analysis.report import Diagnosis, Hang, Regression, Steps, Stragglers, Strategy
from rankscope.analysis.report.data_quality import DataQuality, LayoutQuality, RankCoverage
from rankscope.analysis.report.kernels import AlignmentCheck
from rankscope.analysis.report.stragglers import ArrivalWorker
from rankscope.dashboard.report_html import key_numbers, render_report


@pytest.fixture(scope="module")
def diagnosis() -> Diagnosis:
    return Diagnosis(
        job="job<&>1", sources=["hook"],
        strategy=Strategy(world_size=4, dp=2, pp=2, tp=1, dp_groups=[[0, 2], [1, 3]], pp_groups=[[0, 1], [2, 3]],
                          confidence=0.97),
        steps=Steps(count=3, median_ns=1.25e8, boundaries_ns=[0, 120_000_000, 245_000_000, 370_000_000]),
        stragglers=Stragglers(slowdown=1.371, verdict="worker", waste_fraction=0.2706,
                              by_cause={"worker": 1.3, "stage_imbalance": 1.01}, by_optype={"forward": 1.2},
                              top_workers=[ArrivalWorker(endpoint=3, slowdown=1.33, dp_rank=1, stage=1,
                                                         compute_vs_stage_peers=1.5, own_work_ns=3.0e7,
                                                         last_arrival_share=0.9)]),
        regressions=[Regression(check=AlignmentCheck("alignment", "sm90_gemm_bf16", "gemm_other", [4096, 4096, 4095],
                                                     "bfloat16", "tn", [0], 0.35, "aligned GEMMs of this job",
                                                     "misaligned k=4095", "min", ["k"], "rules"),
                                kind="misaligned_gemm", culprit="sm90_gemm_bf16", factor=1 / 0.35, steps=[0],
                                evidence={})],
        hangs=[Hang(group="dp1", group_key="ranks 1,3", group_ranks=[1, 3], seq=12, op="all_reduce", size_bytes=8,
                    dtype="float32", step=3, missing=[3], mismatched=[], pending_ranks=[1], evidence="pending",
                    arrived=[1], last_seq={"1": 12, "3": 11}, last_completed={}, first_divergent_seq=None,
                    root_cause=True, started_ns=0, first=True, source="hook", missing_input=[])],
        data_quality=DataQuality(records={"comm_op": 10}, rejected={"bad time": 7}, num_rejected=7,
                                 relative_time=False, missing_ranks=[], ranks=RankCoverage(4, None, [], 4, 0),
                                 layout=LayoutQuality("records: stage", {}, [])))


@pytest.fixture(scope="module")
def page(diagnosis) -> str:
    return render_report(diagnosis, {"diff": [{"metric": "step_ms", "baseline": 100.0, "run": 125.0}]})


def test_plotly_js_is_inlined_exactly_once_and_nothing_is_fetched(page):
    assert page.count(get_plotlyjs()[:2000]) == 1
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=", page)


def test_every_figure_has_a_div(page):
    for name in ("strategy", "step_series", "timeline", "heatmap", "optype", "cause", "regressions", "hangs",
                 "diff"):
        assert f'id="plot-{name}"' in page


def test_key_numbers_and_job_name_are_shown_escaped(page):
    assert "job&lt;&amp;&gt;1" in page and "job<&>1" not in page.split("<pre>")[0]
    assert "1.371" in page          # S
    assert "27.1 %" in page         # waste
    assert "2 x 2 x 1" in page      # DP x PP x TP
    assert "125.000 ms" in page     # median step
    assert "sm90_gemm_bf16" in page and "last_arrival_share" in page


def test_unevaluated_sections_say_so():
    d = Diagnosis(job="empty", stragglers=Stragglers(evaluated=False))
    cards = {k: v for k, v, _ in key_numbers(d)}
    assert cards["slowdown S"] == "not evaluated" and cards["verdict"] == "not evaluated"
    page = render_report(d)
    assert "no groups inferred" in page and "no kernel regressions found" in page


def test_strings_from_records_cannot_break_out_of_the_page():
    d = Diagnosis(job="j", regressions=[{"kernel": "</script><img src=x onerror=alert(1)>", "ratio": 0.5,
                                         "reason": "r"}])
    page = render_report(d)
    assert "</script><img" not in page


def test_data_quality_is_listed(page):
    assert "num_rejected" in page and "<td>7</td>" in page


def test_nested_values_read_back():
    from rankscope.dashboard.table_figures import fmt_value

    assert fmt_value({"records": {"comm_op": 3, "flow": 0}, "s": 1.23456}) == "records={comm_op=3; flow=0}; s=1.235"
