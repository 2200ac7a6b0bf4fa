"""Build the Grafana dashboard of a live job (rankscope-live.json beside this file) with Grafana's own
Foundation SDK (``grafana-foundation-sdk``, in the dev extra). Run it after a change of the panels:

    python deploy/grafana/build_dashboard.py > deploy/grafana/rankscope-live.json

Every query reads a series that ``rankscope metrics`` serves (tests/unit/test_deploy.py checks the names
against the metric families and that the JSON loads back through the SDK).
"""

from __future__ import annotations

import sys

from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, QueryVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.table import Panel as Table
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${datasource}")
JOB = 'job="$job"'


def query(expr: str, legend: str = "", instant: bool = False) -> Dataquery:
    q = Dataquery().expr(expr).datasource(PROMETHEUS)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q


def build() -> Dashboard:
    """The live dashboard: where the job is, whether it is slower than itself, who straggles, hangs."""
    return (
        Dashboard("rankscope: live job")
        .uid("rankscope-live")
        .tags(["rankscope", "training"])
        .refresh("10s")
        .time("now-1h", "now")
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(QueryVariable("job").label("job").datasource(PROMETHEUS)
                       .query("label_values(rankscope_window_step, job)"))
        .with_row(Row("Windows"))
        .with_panel(Stat().title("Last window's step").span(6).height(4)
                    .with_target(query(f"rankscope_window_step{{{JOB}}}", instant=True)))
        .with_panel(Stat().title("Windows dropped (analysis lagged)").span(6).height(4)
                    .with_target(query(f"rankscope_window_dropped_total{{{JOB}}}", instant=True)))
        .with_panel(Timeseries().title("Slowdown S per window").span(12).height(8).min(1)
                    .with_target(query(f"rankscope_window_slowdown_ratio{{{JOB}}}", "S")))
        .with_panel(Timeseries().title("Window step time over the job's own median").span(12).height(8)
                    .with_target(query(f"rankscope_window_vs_median_ratio{{{JOB}}}", "vs median")))
        .with_row(Row("Stragglers and hangs"))
        .with_panel(Table().title("Straggler named by the latest window (consecutive windows)").span(12).height(6)
                    .with_target(query(f"rankscope_straggler_windows{{{JOB}}}", "rank {{rank}} ({{cause}})",
                                       instant=True)))
        .with_panel(Table().title("Hang: ranks that never joined").span(12).height(6)
                    .with_target(query(f"rankscope_live_hang_info{{{JOB}}}", "rank {{rank}}", instant=True)))
        .with_panel(Timeseries().title("Per-rank straggler score (relative)").span(24).height(8).max(1.2)
                    .with_target(query(f'rankscope_rank_straggler_score{{{JOB}, score="relative"}}',
                                       "rank {{rank}}")))
    )


def main() -> int:
    sys.stdout.write(JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
