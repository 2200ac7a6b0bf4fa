"""The straggler side of a diagnosis in one line of words: the verdict, its culprit and S.

The CLI prints it per job, the dashboard's band and the text report start from it.
"""

from __future__ import annotations

from rankscope.analysis.report.causes import FINDING_OF
from rankscope.analysis.report.diagnosis import Diagnosis
from rankscope.analysis.report.findings import describe
from rankscope.analysis.report.stragglers import Stragglers, WorkerOrStage


def _unread(reasons: dict[str, str]) -> str:
    return "; ".join(f"{cause} ({why})" for cause, why in reasons.items())


def _under_the_bar(st: Stragglers) -> str:
    """The flows' finding under the verdict's bar, as the summary names it ('' when there is none)."""
    under = (st.below_threshold or [None])[0] if st.verdict == "none" else None
    if not under:
        return ""
    who = under.get("culprit") or "one of " + ", ".join(map(str, under.get("members") or []))
    late = f", {under['late_ns'] / 1e6:.0f} ms late a step" if under.get("late_ns") else ""
    bound = " (a lower bound)" if under.get("cost") else ""
    return f"; under the bar: {under['kind']} {who}{late}{bound}"


def summary_text(diagnosis: Diagnosis) -> str:
    """The CLI summary line of the straggler side: verdict, its culprit, S (and the top finding below the
    threshold)."""
    st = diagnosis.stragglers
    unread = st.not_evaluated or {}
    if not st.evaluated:
        head = f"stragglers not evaluated: {st.why or 'unknown'}"
        return head + ("; not checked: " + _unread(unread) if unread else "")
    findings = diagnosis.findings
    s = f"S {st.slowdown:.2f}" + (" (noise: S < 1)" if st.noise else "")
    s += f", from {st.basis}" if st.basis and st.basis != "compute" else ""
    amb = st.ambiguous
    if isinstance(amb, WorkerOrStage):
        return f"verdict {st.verdict} (ambiguous: worker or stage {amb.stage}, {amb.why}); {s}"
    if amb is not None:
        return f"verdict {st.verdict} (ambiguous between {', '.join(map(str, amb.between))}: {amb.why}); {s}"
    lead = findings[0] if findings else None
    if st.verdict in FINDING_OF and lead is not None and lead.evidence.get("verdict") == st.verdict:
        return f"verdict {st.verdict}: {describe(lead)}; {s}"
    head = f"verdict {st.verdict}; {s}"
    if unread and st.verdict == "none":
        head += "; not evaluated: " + _unread(unread)
    head += _under_the_bar(st)
    return f"{head}; finding {lead.kind}: {describe(lead)}" if lead else head
