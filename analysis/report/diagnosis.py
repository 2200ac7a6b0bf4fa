"""The Diagnosis: everything rankscope concluded about one job, one object for the CLI, dashboard and notebooks.

It serialises to the report contract ``shared/contracts/report.schema.json`` through the declared types
of its sections (:mod:`rankscope.analysis.report.codec`): required keys are always present, and a section
that could not be computed says so with ``evaluated: false`` and ``why``.
"""

from __future__ import annotations

import orjson

from rankscope.analysis.report.codec import decode, doc, encode, to_json
from rankscope.analysis.report.data_quality import DataQuality, LayoutQuality, RankCoverage
from rankscope.analysis.report.findings import Culprit, Finding
from rankscope.analysis.report.hangs import Hang
from rankscope.analysis.report.kernels import Regression
from rankscope.analysis.report.steps import CriticalPath, Steps
from rankscope.analysis.report.stragglers import Stragglers
from rankscope.analysis.report.strategy import Placement, Strategy, Traffic
from rankscope.collectors.record_class import record


def _no_data_quality() -> DataQuality:
    return DataQuality(records={}, rejected={}, num_rejected=0, relative_time=False, missing_ranks=[],
                       ranks=RankCoverage(0, None, [], 0, 0), layout=LayoutQuality("unknown", {}, []))


@record
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

    def to_json(self, indent: bool = True) -> str:
        """The report JSON text: two spaces per level, or one line without ``indent``.

        orjson, not ``json.dumps``: with an indent the standard library encodes in Python, 10 ms of the OSDI'25
        ST trace's 0.6 s run and ~60 ms of the 1 MB report of AR tiled 16x; orjson takes a tenth. The values
        are the same (``to_dict`` already holds NaN and infinities as null, as the contract wants)."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 if indent else 0).decode()

    def encoded(self) -> dict:
        """This Diagnosis as JSON that :meth:`decoded` reads back exactly (the result cache)."""
        return encode(self)

    @staticmethod
    def decoded(data: dict) -> Diagnosis:
        return decode(Diagnosis, data)


@record
class WindowEvent:
    """One window of steps of a live job, as ``rankscope watch`` writes it (one JSON object per line): the
    same sections as the report, over the window's steps only."""

    job: str = doc("the job's name.")
    kind: str = doc("window (a completed window of steps) or hang (a collective waited past the hook's "
                    "timeout; no window completes while it waits).")
    window_start_step: int = doc("the window's first step.")
    window_end_step: int = doc("the window's last step (for a hang, the last step every rank completed).")
    slowdown: float | None = doc("the window's S, as ``stragglers.slowdown`` (null when not evaluated).")
    verdict: str | None = doc("as ``stragglers.verdict``: none, a cause, or mixed; null when not evaluated "
                              "(``why`` says why) and for a hang.")
    culprit: Culprit | None = doc("the verdict's culprit, as the first of ``findings`` (for a hang: the missing "
                                  "ranks); null for verdict none.")
    findings: list[Finding] = doc("the window's findings, as the report's ``findings``.", factory=list)
    hangs: list[Hang] = doc("stuck collectives, as the report's ``hangs``.", factory=list)
    straggler: bool = doc("the window names a straggler: its verdict is a cause whose culprit the section measured "
                          "itself (a finding over its threshold, e.g. a rank >= 1.2x its stage peers in most of "
                          "the window's steps). A cause verdict without such a finding is within the noise of a "
                          "few steps on a busy host, and ``why`` says so.", False)
    straggler_windows: int = doc("consecutive windows, this one included, that named the same straggler (0 when "
                                 "this one names none).", 0)
    basis: str | None = doc("what S was computed from, as ``stragglers.basis``.", None)
    step_time_ns: float | None = doc("the window's median step duration.", None)
    vs_job_median: float | None = doc("that over the median step of the job's earlier windows (null for the "
                                      "first).", None)
    strategy: str | None = doc("the strategy of the first window, ``dp/pp/tp``.", None)
    strategy_check: str | None = doc("same, or what changed against the first window's strategy.", None)
    why: str | None = doc("why the window was not evaluated, why its cause verdict raises no straggler, or which "
                          "ranks a hang waits for.", None, omit="none")
    analysis_s: float = doc("seconds the window's analysis took (its cost).", 0.0)
    at_ns: int = doc("when the event was made (Unix epoch, ns; the recording hosts' clock).", 0)
    window_start_ns: int | None = doc("a flow capture's window: the time it starts, by the flows' end times (Unix "
                                      "epoch, ns; the exporters' clock). Its steps are the capture's own count, "
                                      "so this says which part of the job it covers.", None, omit="none")
    window_end_ns: int | None = doc("a flow capture's window: the time it ends (exclusive; flows that end from "
                                    "then on are the next window's).", None, omit="none")
    dropped_windows: int = doc("windows left unanalysed so far because the analysis fell behind (the bounded "
                               "queue was full).", 0)

    def to_dict(self) -> dict:
        """The event's JSON object."""
        return to_json(self)
