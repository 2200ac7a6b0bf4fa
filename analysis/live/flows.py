"""Live diagnosis of a flow capture: windows of time (flows carry no step marks), each analysed per job
the capture holds, by the same job model and sections as ``analyze`` over that window's flows only.

Job recognition runs on the first window and again only when a window shows endpoints no recognised job
holds (a job started, or moved onto new NICs); otherwise each job keeps its endpoints. Flows are held only
for the window being filled, so a window's cost follows the capture's rate, not its length. A window's
steps are the ones the flows' period gives inside it; ``window_end_step`` counts them over the windows so
far (the capture's own step count, not the job's step numbers, which flows do not carry).

A window ends at the quietest moment of its second half (:func:`quiet_cut`), not at a fixed width: a cut
in the middle of a step puts one ring's transfer of that step in this window and a slower ring's in the
next, and the rings are no longer compared like for like (a real gloo job with one NIC throttled mid-run:
its ring held one collective against its peer's two, and was named in every other window only).
"""

from __future__ import annotations

import time
from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.diagnose import DiagnoseConfig, analyze_model, model_of
from rankscope.analysis.fabric.recognise import job_flows, recognise_jobs
from rankscope.analysis.live.windows import LiveConfig, straggler_named
from rankscope.analysis.report.diagnosis import WindowEvent
from rankscope.collectors.errors import ConfigError, RankscopeError
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.record_class import record


@record
class LiveFlowConfig:
    """Options of the live diagnosis of a flow capture."""

    window_s: float = 10.0
    """seconds of flows per window at most (by the flows' end times); a window closes once a later flow has
    ended, at the quietest moment of its second half (the pause between steps)."""
    warmup_steps: int = LiveConfig.warmup_steps
    """a job's first steps in the capture, not judged (as :attr:`LiveConfig.warmup_steps`): a window is judged
    once its last step is past them. Flows carry no step numbers, so these are the first steps the capture
    shows of each recognised job: a capture that starts mid-job leaves its first windows unjudged too."""
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)

    def __post_init__(self):
        if not self.window_s > 0:
            raise ConfigError(f"LiveFlowConfig: window_s={self.window_s!r}; expected seconds > 0")
        if self.warmup_steps < 0:
            raise ConfigError(f"LiveFlowConfig: warmup_steps={self.warmup_steps!r}; expected >= 0")


class LiveCapture:
    """One flow capture's carried state: its recognised jobs and the flows of the window being filled."""

    def __init__(self, capture: str, config: LiveFlowConfig | None = None):
        self.capture = capture
        self.config = config or LiveFlowConfig()
        self.flows: pl.DataFrame | None = None
        self.window_start_ns: int | None = None
        self.jobs: dict[str, tuple[str, ...]] = {}
        """job name -> its endpoints, as last recognised."""
        self.recognitions = 0
        self.steps: dict[str, int] = {}
        self.streak: dict[str, tuple[object, int]] = {}

    def add(self, new: dict[str, pl.DataFrame]) -> None:
        df = new.get("flow")
        if df is None or df.is_empty():
            return
        self.flows = df if self.flows is None else pl.concat([self.flows, df], how="vertical_relaxed")
        if self.window_start_ns is None:
            self.window_start_ns = int(df["end_ns"].min())

    def windows(self) -> list[WindowEvent]:
        """Events of every window closed since the last call (one per recognised job and window)."""
        out: list[WindowEvent] = []
        width = int(self.config.window_s * 1e9)
        while self.flows is not None and self.window_start_ns is not None \
                and int(self.flows["end_ns"].max()) >= self.window_start_ns + width:
            start = self.window_start_ns
            end = quiet_cut(self.flows, start + width // 2, start + width)
            inside = self.flows.filter(pl.col("end_ns") < end)
            self.flows = self.flows.filter(pl.col("end_ns") >= end)
            self.window_start_ns = end
            if not inside.is_empty():
                out.extend(self._window(inside, (start, end)))
        return out

    def _recognise(self, flows: pl.DataFrame) -> None:
        seen = set(flows["src_addr"].to_list()) | set(flows["dst_addr"].to_list())
        known = {a for eps in self.jobs.values() for a in eps}
        if self.jobs and seen <= known:
            return
        found = recognise_jobs(flows, self.capture, self.config.diagnose.flow)
        self.recognitions += 1
        if found.jobs:
            jobs = {j.name: tuple(j.endpoints) for j in found.jobs}
            self.steps, self.streak = self._carried(jobs)
            self.jobs = jobs

    def _carried(self, jobs: dict[str, tuple[str, ...]]) -> tuple[dict, dict]:
        """Step counts and straggler streaks of newly recognised jobs, each from the known job it shares the
        most endpoints with: recognition names jobs afresh each time (a running job recognised again beside
        a new one may be ``fabric-1``), and a job that has run for steps is no new job in warm-up."""
        steps, streak = {}, {}
        for name, eps in jobs.items():
            shared = {old: len(set(eps) & set(o)) for old, o in self.jobs.items()}
            old = max(shared, key=lambda k: (shared[k], self.steps.get(k, 0)), default=None)
            if old is not None and shared[old]:
                steps[name] = self.steps.get(old, 0)
                streak[name] = self.streak.get(old, (None, 0))
        return steps, streak

    def _window(self, flows: pl.DataFrame, bounds: tuple[int, int]) -> list[WindowEvent]:
        t0 = time.perf_counter()
        self._recognise(flows)
        events = []
        for name, endpoints in sorted(self.jobs.items()):
            frames = JobFrames.from_frames(name, flow=job_flows(flows, list(endpoints)))
            frames.job_endpoints = endpoints
            try:
                d = analyze_model(model_of(frames, self.config.diagnose), self.config.diagnose)[0]
            except (RankscopeError, ValueError) as e:
                events.append(self._event(name, None, f"{type(e).__name__}: {e}", t0, bounds))
                continue
            events.append(self._event(name, d, None, t0, bounds))
        return events

    def _event(self, name: str, d, why: str | None, t0: float, bounds: tuple[int, int]) -> WindowEvent:
        first = self.steps.get(name, 0)
        count = d.steps.count if d is not None and d.steps.evaluated else 0
        self.steps[name] = first + count
        common = {"job": name, "kind": "window", "window_start_step": first, "window_end_step": first + max(count, 1) - 1,
                  "analysis_s": time.perf_counter() - t0, "at_ns": time.time_ns(), "window_start_ns": bounds[0],
                  "window_end_ns": bounds[1]}
        if d is None or not d.stragglers.evaluated:
            self.streak[name] = (None, 0)
            return WindowEvent(slowdown=None, verdict=None, culprit=None, why=why or d.stragglers.why, **common)
        if common["window_end_step"] < self.config.warmup_steps:
            self.streak[name] = (None, 0)
            return WindowEvent(slowdown=None, verdict=None, culprit=None, why=f"warm-up: the job's first "
                               f"{self.config.warmup_steps} steps in the capture are not judged", **common)
        st = d.stragglers
        culprit = d.findings[0].culprit if st.verdict not in (None, "none") and d.findings else None
        named, why = straggler_named(d, culprit)
        key = (st.verdict, repr(culprit)) if named else None
        prev = self.streak.get(name, (None, 0))
        self.streak[name] = (key, prev[1] + 1 if key is not None and key == prev[0] else int(named))
        return WindowEvent(slowdown=st.slowdown, verdict=st.verdict, culprit=culprit, findings=list(d.findings),
                           straggler=named, straggler_windows=self.streak[name][1], basis=st.basis,
                           step_time_ns=d.steps.median_ns or None, why=why, **common)


QUIET_SHARE = 0.01
"""a moment counts as quiet when the rate in flight then exceeds the quietest moment's by at most this share
of the range's peak (a keep-alive or a store's heartbeat is no traffic to avoid)."""


def quiet_cut(flows: pl.DataFrame, lo_ns: int, hi_ns: int) -> int:
    """The latest time in [lo_ns, hi_ns] at which the fewest bytes per second are in flight, to end a window
    at (a flow belongs to the window its end time falls in): the pause between two steps, where no transfer
    is cut from its peers'. ``hi_ns`` when the range has no flow or no quieter moment.

    Needs flow start_ns, end_ns, size_bytes (sampling_rate if known); each record counts at its mean rate
    while it is open, so a long record of a few bytes (a keep-alive) does not hide a pause."""
    f = flows.filter((pl.col("start_ns") < hi_ns) & (pl.col("end_ns") >= lo_ns))
    if f.is_empty():
        return hi_ns
    scale = pl.col("sampling_rate").fill_null(1).clip(lower_bound=1) if "sampling_rate" in f.columns else 1
    f = f.select("start_ns", "end_ns", rate=(pl.col("size_bytes") * scale).cast(pl.Float64)
                 / (pl.col("end_ns") - pl.col("start_ns")).clip(lower_bound=1_000_000))
    starts, ends = f["start_ns"].to_numpy(), f["end_ns"].to_numpy()
    rate = f["rate"].to_numpy()
    # a record is in flight at c when start < c <= end (end < c: in the window; end >= c: in the next)
    cands = np.concatenate([starts, ends + 1, [hi_ns]])
    cands = np.unique(cands[(cands >= lo_ns) & (cands <= hi_ns)])
    s_order, e_order = np.argsort(starts), np.argsort(ends)
    began = np.concatenate([[0.0], np.cumsum(rate[s_order])])[np.searchsorted(starts[s_order], cands, "left")]
    ended = np.concatenate([[0.0], np.cumsum(rate[e_order])])[np.searchsorted(ends[e_order], cands, "left")]
    flying = np.maximum(began - ended, 0.0)
    quiet = flying <= flying.min() + QUIET_SHARE * flying.max()
    return int(cands[quiet][-1])
