"""Incremental diagnosis of a live job: each completed window of steps goes through the same job model
and sections as ``analyze`` (:func:`rankscope.analysis.diagnose.analyze_model`), over that window's records
only.

State carries over between windows, so a window's cost does not grow with the job's length:

- rows are held only for steps not yet analysed (plus the last analysed window, the context a hang needs:
  a rank that skipped a collective shows by what it did just before);
- the strategy of the first evaluated window is kept, and each later window's is checked against it;
- old steps are summarised as a bounded history of step durations (the job's own median pace).

A window is complete when every rank the job has shown has marked its last step. When the analysis falls
behind (more than ``max_pending`` windows complete at once), the oldest are dropped and counted, never
queued without bound. A collective that waited past the hook's timeout (a ``pending`` row from the hook's
watchdog) is reported at once as a ``hang`` event, since no window completes while ranks wait.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import field

import polars as pl

from rankscope.analysis.diagnose import DiagnoseConfig, analyze_model, model_of
from rankscope.analysis.hangs import stuck_collectives
from rankscope.analysis.report.diagnosis import Diagnosis, WindowEvent
from rankscope.analysis.report.findings import OneOf, Rank
from rankscope.analysis.report.strategy import degree_text
from rankscope.analysis.stragglers.findings import measured_findings
from rankscope.collectors.errors import ConfigError, RankscopeError
from rankscope.collectors.hooks.hook_config import HookConfig
from rankscope.collectors.hooks.hook_watchdog import watchdog_period_s
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.record_class import record

LIVE_KINDS = ("comm_op", "compute_op", "step_mark", "batch_meta")
"""the per-rank record kinds a window reads (flows are followed by their own capture)."""

DEFAULT_HANG_TIMEOUT_S = HookConfig.hang_timeout_s
HANG_SLACK_S = 2.0
"""for one flush of the hook's writer (0.5 s under ``attach --live``) and one poll of the watcher (0.5 s)."""


@record
class LiveConfig:
    """Options of the live diagnosis."""

    window_steps: int = 4
    """steps per window; a window is analysed once every rank has marked its last step."""
    hop_steps: int | None = None
    """steps from one window's start to the next (None: ``window_steps``, windows that do not overlap). A
    slowdown is named once most of a window's steps are slow: at most ``window_steps // 2 + hop_steps - 1``
    steps after it starts (3 for 4-step windows with a hop of 2), against up to ``window_steps + 1`` without
    overlap; each step is then analysed ``window_steps / hop_steps`` times."""
    history_steps: int = 512
    """step durations kept as the job's own pace (the median a window is compared with)."""
    warmup_steps: int = 4
    """the job's first steps, not judged: start-up (rendezvous, each pair's first connection, the allocator)
    runs at no steady pace, and a window of it names whichever rank set up last (analyze leaves start-up
    steps out the same way, by the job's pace, which a live job does not know yet)."""
    max_pending: int = 16
    """completed windows waiting for analysis at most; older ones are dropped and counted. A window's rows are
    what it holds in memory, so this bounds memory; 16 covers a busy host's stalls (a loaded 2-core machine
    stalled the watcher for 15 s, 5 windows of a 4-rank job, with a bound of 2)."""
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S
    """the hook's hang timeout (``attach --hang-timeout-s``). A rank that a hang would name missing, with no
    pending call of its own, is named only once it has been silent for this timeout plus the watchdog's
    period and :data:`HANG_SLACK_S`: until then it may be stuck elsewhere with its own dump on the way, and
    naming it would blame a rank that waits (a peer's dump can land first)."""
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)

    def __post_init__(self):
        if self.hop_steps is not None and not 1 <= self.hop_steps <= self.window_steps:
            raise ConfigError(f"LiveConfig: hop_steps={self.hop_steps}; expected 1 to window_steps={self.window_steps}")
        if not self.hang_timeout_s > 0:
            raise ConfigError(f"LiveConfig: hang_timeout_s={self.hang_timeout_s}; expected seconds > 0")
        if self.window_steps < 1 or self.history_steps < 1 or self.max_pending < 1 or self.warmup_steps < 0:
            raise ConfigError(f"LiveConfig: window_steps={self.window_steps}, history_steps={self.history_steps}, "
                              f"max_pending={self.max_pending}, warmup_steps={self.warmup_steps}; expected each "
                              ">= 1 (warmup_steps >= 0)")


def _strategy_text(d: Diagnosis) -> str | None:
    s = d.strategy
    if not s.evaluated:
        return None
    return f"{degree_text(s.dp)}/{degree_text(s.pp)}/{degree_text(s.tp)}"


class LiveJob:
    """One live job's carried state; feed it new rows with :meth:`add`, take events from :meth:`windows`."""

    def __init__(self, job: str, config: LiveConfig | None = None):
        self.job = job
        self.config = config or LiveConfig()
        self.rows: dict[str, pl.DataFrame] = {}
        self.context: dict[str, pl.DataFrame] = {}
        """the last analysed window's rows (for a hang's context)."""
        self.next_step = 0
        self.hop = self.config.hop_steps or self.config.window_steps
        self.paced_upto = -1
        """the last step whose duration is in the pace history (overlapping windows share steps)."""
        self.ranks: set[int] = set()
        self.pace: deque[int] = deque(maxlen=self.config.history_steps)
        self.strategy: str | None = None
        self.dropped = 0
        self.hangs_seen: set[tuple] = set()
        self.unplaced = 0
        """rows without a step (no window can hold them), not kept."""
        self.streak: tuple[object, int] = (None, 0)
        """the last straggler named (verdict and culprit) and in how many windows in a row."""

    # ------------------------------------------------------------------ input
    def add(self, new: dict[str, pl.DataFrame]) -> None:
        """Rows just written (kind -> frame); kinds outside :data:`LIVE_KINDS` are ignored."""
        for kind, df in new.items():
            if kind not in LIVE_KINDS or df.is_empty():
                continue
            # rows of steps already analysed (a late flush) cannot change a window, and rows without a step
            # belong to none: neither is kept (counted, so memory stays bounded by the pending steps)
            self.unplaced += int(df["step"].null_count())
            df = df.filter(pl.col("step") >= self.next_step)
            self.ranks.update(int(r) for r in df["rank"].drop_nulls().unique().to_list())
            old = self.rows.get(kind)
            self.rows[kind] = df if old is None else pl.concat([old, df], how="vertical_relaxed")

    def completed_step(self) -> int | None:
        """The last step every rank seen so far has marked, or None."""
        marks = self.rows.get("step_mark")
        if marks is None or marks.is_empty() or not self.ranks:
            return None
        last = marks.group_by("rank").agg(pl.col("step").max())
        if last.height < len(self.ranks):
            return None
        return int(last["step"].min())

    # ------------------------------------------------------------------ windows
    def windows(self) -> list[WindowEvent]:
        """Events of a new hang, then of the windows completed since the last call (at most ``max_pending``)."""
        done = self.completed_step()
        # a hang first: it is urgent, and no window completes while ranks wait
        hang = self._hang(done)
        n = self.config.window_steps
        ready = [] if done is None else list(range(self.next_step, done - n + 2, self.hop))
        if len(ready) > self.config.max_pending:
            skip = len(ready) - self.config.max_pending
            self.dropped += skip
            self._forget(ready[skip] - 1)
            ready = ready[skip:]
        events = [] if hang is None else [hang]
        return events + [self._window(a, a + n - 1) for a in ready]

    def _frames(self, rows: dict[str, pl.DataFrame]) -> JobFrames:
        return JobFrames.from_frames(self.job, **{k: v for k, v in rows.items() if not v.is_empty()})

    def _in(self, lo: int, hi: int) -> dict[str, pl.DataFrame]:
        return {k: v.filter(pl.col("step").is_between(lo, hi)) for k, v in self.rows.items()}

    def _forget(self, last: int) -> None:
        """Drop the rows of steps up to ``last``."""
        self.rows = {k: v.filter(pl.col("step") > last) for k, v in self.rows.items()}
        self.next_step = last + 1

    def _window(self, a: int, b: int) -> WindowEvent:
        t0 = time.perf_counter()
        rows = self._in(a, b)
        if b < self.config.warmup_steps:
            # analysed all the same, the verdict unused: the first analysis of a process is the slow one
            # (imports, first calls), and paying it here keeps the first judged window from lagging the job
            self._analyse(rows)
            self.context = rows
            self._forget(a + self.hop - 1)
            return WindowEvent(job=self.job, kind="window", window_start_step=a, window_end_step=b, slowdown=None,
                               verdict=None, culprit=None, why=f"warm-up: the job's first {self.config.warmup_steps} "
                               "steps are not judged", analysis_s=time.perf_counter() - t0, at_ns=time.time_ns(),
                               dropped_windows=self.dropped)
        d, why = self._analyse(rows)
        self.context = rows
        self._forget(a + self.hop - 1)
        if d is None:
            return WindowEvent(job=self.job, kind="window", window_start_step=a, window_end_step=b, slowdown=None,
                               verdict=None, culprit=None, why=why, analysis_s=time.perf_counter() - t0, at_ns=time.time_ns(),
                               dropped_windows=self.dropped)
        return self._event(d, a, b, time.perf_counter() - t0)

    def _analyse(self, rows: dict[str, pl.DataFrame]) -> tuple[Diagnosis | None, str | None]:
        try:
            return analyze_model(model_of(self._frames(rows), self.config.diagnose), self.config.diagnose)[0], None
        except (RankscopeError, ValueError) as e:
            return None, f"{type(e).__name__}: {e}"

    def _event(self, d: Diagnosis, a: int, b: int, cost_s: float) -> WindowEvent:
        st = d.stragglers
        steps = [(i, x) for i, x, w in _step_durations(d) if not w]
        step_ns = float(pl.Series([x for _, x in steps]).median()) if steps else None
        vs = step_ns / float(pl.Series(list(self.pace)).median()) if step_ns and self.pace else None
        self.pace.extend(x for i, x in steps if i > self.paced_upto)
        self.paced_upto = max([self.paced_upto, *(i for i, _ in steps)])
        text = _strategy_text(d)
        if self.strategy is None:
            self.strategy, check = text, ("first" if text else None)
        else:
            check = "same" if text == self.strategy else f"{text or 'not evaluated'} (was {self.strategy})"
        culprit = d.findings[0].culprit if st.evaluated and st.verdict not in (None, "none") and d.findings else None
        named, why = straggler_named(d, culprit)
        key = (st.verdict, repr(culprit)) if named else None
        self.streak = (key, self.streak[1] + 1 if key is not None and key == self.streak[0] else int(named))
        return WindowEvent(job=self.job, kind="window", window_start_step=a, window_end_step=b,
                           slowdown=st.slowdown if st.evaluated else None, verdict=st.verdict if st.evaluated else None,
                           culprit=culprit, findings=list(d.findings), hangs=list(d.hangs), straggler=named,
                           straggler_windows=self.streak[1], basis=st.basis,
                           step_time_ns=step_ns, vs_job_median=vs, strategy=self.strategy, strategy_check=check,
                           why=why, analysis_s=cost_s, at_ns=time.time_ns(),
                           dropped_windows=self.dropped)

    def _hang(self, done: int | None) -> WindowEvent | None:
        """A hang event when the hook dumped pending calls not reported yet, once every rank it would name
        missing is known to wait nowhere (see ``LiveConfig.hang_timeout_s``)."""
        comm = self.rows.get("comm_op")
        if comm is None:
            return None
        pending = comm.filter(pl.col("state") == "pending")
        if pending.is_empty():
            return None
        t0, now = time.perf_counter(), time.time_ns()
        rows = {k: pl.concat([self.context[k], v], how="vertical_relaxed") if k in self.context else v
                for k, v in self.rows.items()}
        hangs = stuck_collectives(self._frames(rows))
        new = [h for h in hangs if (h.group_key, h.seq, tuple(h.missing), tuple(h.pending_ranks))
               not in self.hangs_seen]
        if not new:
            return None
        # a rank that waits in another stuck call is missing as a consequence; the roots wait nowhere
        roots = [h for h in hangs if h.root_cause] or hangs
        missing = sorted({r for h in roots for r in h.missing})
        if self._unsettled(missing, rows, pending, now):
            return None
        self.hangs_seen.update((h.group_key, h.seq, tuple(h.missing), tuple(h.pending_ranks)) for h in hangs)
        culprit = (Rank(missing[0]) if len(missing) == 1 else OneOf(one_of=missing, stage=None)) if missing else None
        end = done if done is not None else self.next_step - 1
        return WindowEvent(job=self.job, kind="hang", window_start_step=self.next_step, window_end_step=end,
                           slowdown=None, verdict=None, culprit=culprit, hangs=hangs, strategy=self.strategy,
                           why="a collective waited past the hook's timeout: "
                               + (f"rank(s) {missing} never joined" if missing else "no member is missing"),
                           analysis_s=time.perf_counter() - t0, at_ns=time.time_ns(), dropped_windows=self.dropped)

    @property
    def settle_ns(self) -> int:
        """How long a missing rank without a pending call must have been silent to be known to wait nowhere."""
        t = self.config.hang_timeout_s
        return int((t + watchdog_period_s(t) + HANG_SLACK_S) * 1e9)

    def _unsettled(self, missing: list[int], rows: dict[str, pl.DataFrame], pending: pl.DataFrame,
                   now: int) -> list[int]:
        """Missing ranks with no pending call that were active too recently to be known to wait nowhere."""
        waiting = set(pending["rank"].to_list())
        quiet = [r for r in missing if r not in waiting]
        if not quiet:
            return []
        settle = self.settle_ns
        last: dict[int, int] = {}
        for df in rows.values():
            cols = [c for c in ("end_ns", "start_ns", "ts_ns") if c in df.columns]
            if not cols or "rank" not in df.columns:
                continue
            got = (df.filter(pl.col("rank").is_in(quiet))
                   .group_by("rank").agg(pl.max_horizontal(*[pl.col(c).max() for c in cols]).alias("t")))
            for r, t in got.iter_rows():
                if t is not None:
                    last[int(r)] = max(last.get(int(r), t), int(t))
        return [r for r in quiet if r in last and now - last[r] < settle]


UNCONFIRMED = ("the verdict's culprit has no finding of its own in this window (no threshold of the section "
               "listed it): S {s:.3f} over {n} steps is within a short window's noise, so no straggler is raised")


def straggler_named(d: Diagnosis, culprit) -> tuple[bool, str | None]:
    """(whether the window names a straggler, why not when its verdict is a cause; see WindowEvent.straggler)."""
    st = d.stragglers
    if not st.evaluated:
        return False, st.why
    if culprit is None:
        return False, None
    first = d.findings[0]
    if any(f.kind == first.kind and f.culprit == first.culprit for f in measured_findings(st)):
        return True, None
    return False, UNCONFIRMED.format(s=st.slowdown, n=len(st.steps or []))


def _step_durations(d: Diagnosis) -> list[tuple[int, int, bool]]:
    """(step id, duration, whether the one step definition calls it warm-up) of each step of a window."""
    durs = d.steps.durations_ns or []
    ids = d.steps.table.step_ids if d.steps.table is not None else []
    if len(ids) != len(durs):
        return []
    left = {w.step for w in d.steps.warmup}
    return [(int(i), int(x), i in left) for i, x in zip(ids, durs)]
