"""The report's key sections as plain text, for a terminal (``rankscope analyze --format text``)."""

from __future__ import annotations

from rankscope.analysis.report import Diagnosis, degree_text, describe, summary_text

MAX_ROWS = 8
"""rows per list section; the JSON report holds them all."""


def _groups(groups: list, n: int = 4, sep: str = ", ") -> str:
    shown = "; ".join(sep.join(map(str, g)) if len(g) <= 8 else f"{g[0]} ... {g[-1]} ({len(g)})"
                      for g in groups[:n])
    return shown + (f"; ... {len(groups) - n} more" if len(groups) > n else "")


def tied_labellings(strategy) -> str:
    """The other labellings of a standing tie as ``dp=1 pp=2; ...``, or '' when the strategy is not one: the flows
    fit them as well as the one reported, which is listed first only by the order candidates are tried."""
    out = []
    for a in strategy.tied_labellings:  # alternatives left standing, never a broken tie
        text = f"dp={a.dp} pp={a.pp}"
        if (a.dp, a.pp) == (strategy.dp, strategy.pp) and a.dp_groups:
            # the same degrees, other members (a 2 x 2 grid's DP/PP swap): the groups are the difference
            text += f" with DP groups {_groups(a.dp_groups, n=2)}"
        out.append(text)
    return "; ".join(out)


def _share(x) -> str:
    return "?" if x is None else f"{x:.0%}"


def _network_lines(d: Diagnosis) -> list[str]:
    """Traffic (kinds, the costliest pairs that are not ok) and placement (shares per class), flow jobs only."""
    out, t, p = [], d.traffic, d.placement
    if t is not None and t.evaluated:
        out.append(f"traffic      {', '.join(f'{k} {v}' for k, v in t.kinds.items())} pairs  ({t.topology})")
        out += [f"  {x.kind:<10} {x.src} -> {x.dst} {'/'.join(x.classes) or '-'}: ratio "
                f"{'?' if x.ratio is None else f'{x.ratio:.2f}'}, {x.cost_ns / 1e6:.1f} ms extra transfer per {t.bytes_per}"
                for x in t.pairs[:MAX_ROWS] if x.kind != "ok"]
    elif t is not None:
        out.append(f"traffic      not evaluated: {t.why}")
    if p is not None and p.evaluated:
        out.append("placement    " + "; ".join(f"{c.name} leaf {_share(c.in_leaf)} / spine {_share(c.across_leaves)} / "
                                               f"pods {_share(c.across_pods)}" for c in p.classes))
        if p.groups_across_pods:
            out.append(f"  across pods {len(p.groups_across_pods)} groups/pipelines, "
                       f"{len(p.pipeline_links_across_pods)} pipeline links")
    return out


def render_text(d: Diagnosis) -> str:
    """Strategy, steps, straggler verdict with its evidence, findings, regressions, hangs, data quality."""
    lines = [f"== {d.job}  (sources: {', '.join(d.sources) or 'none'})"]
    s = d.strategy
    if s.evaluated:
        lines.append(f"strategy     dp={degree_text(s.dp)} pp={degree_text(s.pp)} tp={degree_text(s.tp)} on {s.world_size} endpoints, "
                     f"confidence {s.confidence:.2f}")
        tied = tied_labellings(s)
        if tied:
            lines.append(f"  ambiguous  the flows fit as well: {tied} (see strategy.alternatives)")
        if (s.pp or 1) > 1:
            known = s.stage_order_known
            lines.append(f"  pipelines  {_groups(s.pp_groups, sep=' > ' if known else ' - ')}"
                         + ("" if known else "  (stage order unknown: direction not reported)"))
        if (s.dp or 1) > 1:
            lines.append(f"  DP groups  {_groups(s.dp_groups)}")
        lines += [f"  undecided  {u.field}: {u.why}" for u in s.undecided]
    else:
        lines.append(f"strategy     not evaluated: {s.why or '?'}")
    st = d.steps
    if st.count:
        warm = st.warmup
        lines.append(f"steps        {st.count}, median {st.median_ns / 1e6:,.1f} ms"
                     + (f"; warm-up left out: {', '.join(str(w.step) for w in warm)}" if warm else "")
                     + (" (ambiguous: may be a multiple of the step)" if st.ambiguous else ""))
    else:
        lines.append(f"steps        unknown: {st.why or 'no step boundaries'}")
    sg = d.stragglers
    lines.append(f"stragglers   {summary_text(d)}")
    if sg.evaluated:
        shares = (sg.whatif.verdict_shares if sg.whatif is not None else None) or sg.by_cause
        lines.append("  shares     " + ", ".join(f"{k} {v:.2f}" for k, v in shares.items())
                     + f"  (waste {sg.waste_fraction:.1%}; M_W {sg.by_cause.get('worker', 0):.3f}, "
                       f"M_S {sg.by_cause.get('stage_imbalance', 0):.3f})")
    lines.append(f"findings     {len(d.findings)}")
    lines += [f"  {f.kind:<18} {describe(f)}" for f in d.findings[:MAX_ROWS]]
    lines.append(f"regressions  {len(d.regressions)}")
    lines += [f"  {r.check.kernel} {r.check.shape} ratio {r.check.ratio:.2f}: {r.check.reason}"
              for r in d.regressions[:MAX_ROWS]]
    lines.append(f"hangs        {len(d.hangs)}")
    lines += [f"  group {h.group} seq {h.seq} {h.op}: missing {h.missing}" for h in d.hangs[:MAX_ROWS]]
    lines += _network_lines(d)
    dq = d.data_quality
    missing = dq.missing_ranks
    lines.append(f"data quality {dq.num_rejected:,} records rejected"
                 + (f"; missing ranks {missing[:16]}{' ...' if dq.ranks.missing > 16 else ''}"
                    f"{f' ({dq.ranks.missing:,} in all)' if dq.ranks.missing > len(missing) else ''}"
                    if missing else ""))
    return "\n".join(lines)
