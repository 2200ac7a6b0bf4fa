"""The cause chart shows the shares the verdict used, labelled apart from OSDI'25's M_W and M_S (issue 12)."""

from rankscope.analysis.report import Stragglers
from rankscope.analysis.report.stragglers import WhatIf
from rankscope.dashboard.figures import cause_figure


def test_cause_chart_plots_the_verdict_shares_and_names_the_stage():
    s = Stragglers(slowdown=1.3, verdict="stage_imbalance", by_cause={"worker": 0.2, "stage_imbalance": 0.1},
                   basis="compute", whatif=WhatIf(
                       model="generic", verdict_stage=2, T_ns=1.3, T_ideal_ns=1.0, step_slowdown=[1.3],
                       verdict_shares={"worker": 0.2, "communication": 0.0, "sequence_imbalance": 0.0,
                                       "stage_imbalance": 0.9}))
    fig = cause_figure(s)
    verdict_bars, paper_bars = fig.data
    assert dict(zip(verdict_bars.x, verdict_bars.y, strict=True))["stage_imbalance"] == 0.9
    assert verdict_bars.name == "share the verdict used"
    assert list(paper_bars.x) == ["M_W (OSDI'25, top 3% workers)", "M_S (OSDI'25, last stage)"]
    assert "stage 2" in fig.layout.title.text
