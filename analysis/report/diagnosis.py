"""The Diagnosis: everything rankscope concluded about one job, one object for the CLI, dashboard and notebooks.

It serialises to the report contract ``shared/contracts/report.schema.json`` through the declared types
of its sections (:mod:`rankscope.analysis.report.codec`): required keys are always present, and a section
that could not be computed says so with ``evaluated: false`` and ``why``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rankscope.analysis.report.codec import decode, doc, encode, to_json
from rankscope.analysis.report.data_quality import DataQuality, LayoutQuality, RankCoverage
from rankscope.analysis.report.findings import Finding
from rankscope.analysis.report.hangs import Hang
from rankscope.analysis.report.kernels import Regression
from rankscope.analysis.report.steps import CriticalPath, Steps
from rankscope.analysis.report.stragglers import Stragglers
from rankscope.analysis.report.strategy import Placement, Strategy, Traffic


def _no_data_quality() -> DataQuality:
    return DataQuality(records={}, rejected={}, num_rejected=0, relative_time=False, missing_ranks=[],
                       ranks=RankCoverage(0, None, [], 0, 0), layout=LayoutQuality("unknown", {}, []))


@dataclass(frozen=True)
class Diagnosis:
    """One job's report."""

    job: str = doc("the job's name (a training job, or a job recognised in a flow capture).")
    sources: list[str] = doc("record sources used, e.g. flows, kineto, hook, flight_recorder, whatif_parquet.",
                             factory=list)
    strategy: Strategy = doc("the parallel strategy.", factory=Strategy)
    steps: Steps = doc("the steps.", factory=Steps)
    stragglers: Stragglers = doc("the what-if attribution of the slowdown.", factory=Stragglers)
    regressions: list[Regression] = doc("kernel regressions, worst ratio first.", factory=list)
    hangs: list[Hang] = doc("stuck collectives, first stuck first.", factory=list)
    data_quality: DataQuality = doc("what the report rests on.", factory=_no_data_quality)
    critical_path: CriticalPath = doc("the chain of ops across ranks that sets each step's end, its shares, "
                                      "and the edits that would shorten it.", factory=CriticalPath)
    traffic: Traffic | None = doc("flow jobs: the traffic the strategy implies against the flows, pair by pair; "
                                  "absent without flow records.", None, omit="none")
    placement: Placement | None = doc("flow jobs: where each traffic class's bytes go in the fabric (in a leaf, "
                                      "across leaves, across pods) and what spans pods; absent without flow "
                                      "records.", None, omit="none")
    findings: list[Finding] = doc("anomalies named with their culprit, from every section; the verdict's "
                                  "culprit first.", factory=list)

    def to_dict(self) -> dict:
        """The report JSON object."""
        return to_json(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def encoded(self) -> dict:
        """This Diagnosis as JSON that :meth:`decoded` reads back exactly (the result cache)."""
        return encode(self)

    @staticmethod
    def decoded(data: dict) -> Diagnosis:
        return decode(Diagnosis, data)
