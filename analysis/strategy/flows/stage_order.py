"""Stage order from the data-parallel traffic of each stage: the last stage finishes its backward first.

In every pipeline schedule (GPipe, 1F1B, interleaved) the final backward of a step runs from the last
stage to the first: the last stage's gradients are ready first, and each upstream stage waits for the
gradient of its last micro-batch before it can finish. So within each step a stage's data-parallel
gradient reduction (all-reduce, or reduce-scatter then all-gather) starts, and so ends, later the further
upstream the stage is. That holds whatever the transport does to the pipeline link itself (ACK flows that
open both of its directions together), and for two-stage pipelines, whose single link shows no chronology.

Each DP group's payload records are merged into bursts (one a step when the exporter cuts records at
least once a step); the burst ends of two stages are matched step by step, and a step votes when both
its starts and its ends are further apart than the clock can blur (20 ticks, and MIN_STAGE_END_GAP_NS),
the same way round: ends apart after starts together are reductions of different lengths (a slow NIC's
ring), not the stage order. Two stages' votes count only when most of their matched steps vote the same
way. Where too few steps pass that wide floor and none votes the other way, the steps are counted again
past the clock's own blur (two ticks): then every step that votes must vote the same way. The last burst
is left out (it may run on into the job's shutdown), and so are groups with fewer than MIN_STEP_BURSTS.

:func:`order_pipelines` orients the pipelines that :func:`rankscope.analysis.fabric.grid.fit_grid`
found, from these votes and the pipeline links' own times (link chronology, direction lag, where an
interleaved pipeline's cycle wraps); the votes between the same two stages are tallied over all
pipelines, each way apart, so one late-sampled record cannot flip the order and a split shows.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.grid import GridFit
from rankscope.analysis.fabric.link_evidence import lag_floor_ns
from rankscope.analysis.fabric.pair_graph import address_key
from rankscope.analysis.fabric.pair_traffic import MIN_BURST_GAP_NS, on_pairs
from rankscope.analysis.fabric.tie_evidence import ends_from_wrap, wrap_by_bytes
from rankscope.analysis.strategy.flows.link_dating import MIN_STEP_BURSTS

MIN_STAGE_END_GAP_NS = 1_000_000
"""two stages' gradient reductions starting or ending closer than this vote nothing: exporters' clock
offsets left after alignment are of this order, and one micro-batch's backward is longer."""


def _bursts(t: pl.DataFrame, gap_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of records apart by idle gaps of at most ``gap_ns``."""
    t = t.sort("start_ns")
    s, e = t["start_ns"].to_numpy(), t["end_ns"].to_numpy()
    if not len(s):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    busy = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > busy[:-1] + gap_ns]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _step_votes(gaps: list[tuple[int, int]], floor: int) -> tuple[int, int]:
    """(steps voting the first stage upstream, steps voting the second) among matched steps' (ends apart,
    starts apart): a reduction that started and ended later belongs to the upstream stage. Ends alone are
    no order: two reductions that start together and end apart took different times (a slow NIC's ring:
    a real gloo DP2 x PP2 job's stage-1 ring ended 1.2-1.5 s after stage 0's, every step, both starting
    within a millisecond)."""
    up = down = 0
    for d, ds in gaps:
        if abs(d) > floor and abs(ds) > floor and (d > 0) == (ds > 0):
            up, down = (up + 1, down) if d > 0 else (up, down + 1)
    return up, down


def dp_end_votes(flows: pl.DataFrame, dp_groups: list[list[str]], pipelines: list[list[str]],
                 dp_pairs: set[tuple[str, str]],
                 resolution_ns: int) -> dict[tuple[int, int], tuple[int, int]]:
    """Per ordered pair of DP groups (i, j) joined by a pipeline link: (steps voting i upstream of j,
    steps voting j upstream of i); a pair is left out unless most of its matched steps vote the same way.
    Needs flows src_addr, dst_addr, start_ns, end_ns (is_data if present); ``dp_pairs``: the job's
    data-parallel links as (a, b) address pairs."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    if flows.is_empty() or not dp_pairs or len(dp_groups) < 2:
        return out
    group_of = {x: i for i, g in enumerate(dp_groups) for x in g}
    f = flows.filter(pl.col("is_data")) if "is_data" in flows.columns else flows
    f = on_pairs(f, dp_pairs)
    if f.is_empty():
        return out
    f = f.with_columns(g=pl.col("src_addr").replace_strict(group_of, default=-1, return_dtype=pl.Int64))
    gap = max(MIN_BURST_GAP_NS, 20 * int(resolution_ns))
    floor = max(MIN_STAGE_END_GAP_NS, 20 * int(resolution_ns))
    blur = max(MIN_STAGE_END_GAP_NS, 2 * int(resolution_ns))
    # a step's bursts only: the last burst may run on into the job's shutdown (barriers, teardown), and
    # fewer than MIN_STEP_BURSTS bursts are records kept open across steps, whose ends are no step's
    bursts = {int(g): (b[0][:-1], b[1][:-1]) for (g,), t in f.group_by("g") if g >= 0
              for b in [_bursts(t, gap)] if len(b[0]) >= MIN_STEP_BURSTS}
    stage_pairs = {(group_of[u], group_of[v]) for p in pipelines for u, v in zip(p, p[1:])
                   if u in group_of and v in group_of}
    stage_pairs |= {(group_of[p[-1]], group_of[p[0]]) for p in pipelines if len(p) > 2}
    matched: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, j in stage_pairs:
        a, b = (i, j) if i < j else (j, i)
        if a not in bursts or b not in bursts or (a, b) in matched:
            continue
        (sa, ea), (sb, eb) = bursts[a], bursts[b]
        if not len(ea) or not len(eb):
            continue
        # match each of a's bursts to b's nearest; a step apart is no match
        spacing = np.median(np.diff(ea)) if len(ea) > 1 else np.inf
        gaps = []  # per matched step: (ends apart, starts apart), + where a is later
        for x, xs in zip(ea, sa):
            k = int(np.argmin(np.abs(eb - x)))
            d, ds = int(x) - int(eb[k]), int(xs) - int(sb[k])
            if abs(d) < 0.5 * spacing:
                gaps.append((d, ds))
        matched[(a, b)] = gaps
    for (a, b), gaps in matched.items():
        up, down = _step_votes(gaps, floor)
        # the stage order holds every step, so it shows in most of them. Where most steps' reductions end
        # within the clock's blur, the few that stand apart were set apart by something else (one
        # reduction ran longer: more bytes, a busy CPU): a real gloo DP2 x PP2 job's five steps ended
        # -6, -32, +20, +14 and +3 ms apart, and the one step past the floor ordered it backwards
        if max(up, down) * 2 <= len(gaps) and min(up, down) == 0:
            # too few steps past the wide floor, none the other way: the stages may stand closer than it
            # (one micro-batch's backward of 19-20 ms against a 20 ms floor, steady to the tick in every
            # step, on two of a job's four rails). Past the clock's own blur (two ticks), every step that
            # votes must vote the same way, and most steps must vote: noise like that gloo job's splits
            up, down = _step_votes(gaps, blur)
            if min(up, down) > 0:
                continue
        if max(up, down) * 2 <= len(gaps):
            continue
        out[(a, b)] = (up, down)
        out[(b, a)] = (down, up)
    return out


def _link_times(pe: pl.DataFrame, undated: set[frozenset] = frozenset()) -> tuple[dict, dict]:
    """(first payload per link, last record per link) of pipeline links; no first time for an ``undated``
    link, whose first record dates its TCP connection's set-up, and no last time where ``last_link`` is
    null (the caller nulls it where the record ends at the teardown)."""
    link_first, link_last = {}, {}
    has_last = "last_link" in pe.columns
    for row in pe.iter_rows(named=True):
        a, b, fa, fb = row["a"], row["b"], row["first_ab"], row["first_ba"]
        key = frozenset((a, b))
        dated = key not in undated
        link_first[key] = min((x for x in (fa, fb) if x is not None), default=None) if dated else None
        link_last[key] = row["last_link"] if has_last else None
    return link_first, link_last


def _link_bytes(pe: pl.DataFrame) -> dict:
    """(a, b) -> bytes a sent b, for both directions of each pipeline link (empty without the columns)."""
    if not {"bytes_ab", "bytes_ba"} <= set(pe.columns):
        return {}
    out = {}
    for a, b, x, y in pe.select("a", "b", "bytes_ab", "bytes_ba").iter_rows():
        out[(a, b)], out[(b, a)] = x, y
    return out


def _wrap_scores(path: list[str], link_first: dict, link_last: dict) -> np.ndarray:
    """Per link of a cycle (link i joins path[i] and path[i+1]): how much it looks like the
    interleaved pipeline's wrap-around link. Going round the cycle the first activation reaches each
    next stage later, so the last stage's link back to the first starts latest of all, and the last
    gradients leave it earliest of all (it is the most downstream link). Link times (either
    direction: the reverse direction's record may open with the transport's ACKs), ranked."""
    n = len(path)
    links = [frozenset((path[i], path[(i + 1) % n])) for i in range(n)]
    score = np.zeros(n)
    for times, sign in ((link_first, 1.0), (link_last, -1.0)):
        t = [times.get(x) for x in links]
        if any(x is None for x in t):
            continue
        from scipy.stats import rankdata

        score += sign * rankdata(np.array(t, dtype=float))  # tied times (coarse clocks) share a rank
    return score


def _walk(p: list[str], adj: dict) -> tuple[list[str], bool]:
    """A pipeline's members in link order from one end (any member for a cycle); whether it is a cycle."""
    ends = sorted((x for x in p if len(adj[x]) == 1), key=address_key)
    path = [ends[0]] if ends else [p[0]]
    while len(path) < len(p):
        nxt = [y for y in adj[path[-1]] if y not in path]
        if not nxt:
            break
        path.append(nxt[0])
    return path, not ends and len(path) > 2


def order_pipelines(fit: GridFit, edges: pl.DataFrame, resolution_ns: int = 1,
                    stage_votes: dict[tuple[int, int], tuple[int, int]] | None = None,
                    exporter_skew_ns: int = FlowConfig.max_exporter_skew_ns,
                    undated: set[frozenset] = frozenset()) -> tuple[list[list[str]], float]:
    """Order each pipeline first stage to last; returns (pipelines, share of consistent votes: 0 when
    any pipeline got no vote, its direction then being a guess).

    Three kinds of votes, summed per pair of stages (DP groups) over all pipelines, each way apart (the
    share counts the minority against the majority):

    - *link chronology*: the first micro-batch's activations reach each next stage later, so going
      downstream each link's first payload comes later than the previous link's; the last
      gradients leave each stage earlier than its upstream neighbour's, so each link's last
      record ends earlier going downstream. Both are link-level times (either direction) and so
      hold with ACK flows and TCP, where the reverse direction opens with the data;
    - *direction lag*: on one link the activation direction starts before the gradient direction;
      counted only when the two starts are clearly apart (fabric.link_evidence.lag_floor_ns: beyond
      ``exporter_skew_ns`` when two exporters timed them, ``same_clock`` not true).

    First times and direction lags of ``undated`` links (strategy.flows.link_dating.connection_dated) do not
    vote; a link's last time votes where ``last_link`` is not null (strategy.flows.infer nulls it for undated
    links whose flags do not show the teardown apart: strategy.flows.link_dating.ends_dated).
    Needs edges a, b, first_ab, first_ba (last_link when present) and the fit's pipeline edges.
    """
    stage_key = {x: i for i, g in enumerate(fit.dp_groups) for x in g}
    pe = edges.filter(pl.Series(fit.is_pp))
    link_first, link_last = _link_times(pe, undated)
    tally = _StageTally(stage_key)
    # steps whose stages' data-parallel reductions end in one order or the other (dp_end_votes)
    tally.add_reduction_votes(stage_votes or {})
    _vote_direction_lags(tally, pe, resolution_ns, exporter_skew_ns, undated)
    link_bytes = _link_bytes(pe)
    walks = _walks(fit.pipelines, pe)
    # each time is cut to a clock tick, so two times less than two ticks apart may be in either order:
    # such a difference is no vote (one millisecond between two whole-job TCP records ordered a real
    # 4-stage pipeline backwards, "clearly")
    apart = 2 * int(resolution_ns)
    for _, path, cyclic in walks:
        links = [frozenset(x) for x in zip(path, path[1:] + ([path[0]] if cyclic else []))]
        _vote_link_chronology(tally, path, links, link_first, link_last, apart)
        if cyclic and link_bytes:
            _vote_ends_from_wrap(tally, path, links, link_last, link_bytes)
    votes, split = tally.net_and_split()
    oriented, guessed = _orient(walks, votes, stage_key, fit.dp_groups)
    wrap, pooled = _pooled_wrap_scores(oriented, stage_key, link_first, link_last, link_bytes)
    out, share = _cut_and_agree(oriented, wrap, pooled, votes, split, stage_key)
    # the direction of an unvoted pipeline is a coin flip, whatever the others' votes said: no claim
    # (a job whose reductions vote on some rails and not on another would otherwise read "voted
    # clearly" while the unvoted rail may run backwards)
    if guessed:
        share = 0.0
    return sorted(out, key=lambda m: address_key(m[0])), share


class _StageTally:
    """The weight of the votes that one stage (DP group) is upstream of another.

    ``pro[(i, j)]``: the weight of the votes that stage i is upstream of stage j. The two ways are kept
    apart, so that the minority counts against the agreement: 64 links between two stages voting 40 to
    24 are noise, not a clear 16 (a RoCE interleaved pipeline whose ACK-opened reverse records lagged by
    the exporters' offset alone, both ways, would otherwise be ordered backwards at "voted clearly").
    """

    def __init__(self, stage_key: dict[str, int]):
        self.stage_key = stage_key
        self.pro: dict[tuple[int, int], float] = defaultdict(float)

    def vote(self, u: str, v: str, s: float) -> None:
        """Add ``s`` to the votes that address ``u``'s stage is upstream of ``v``'s (s < 0: downstream)."""
        ku, kv = self.stage_key[u], self.stage_key[v]
        if s > 0:
            self.pro[(ku, kv)] += s
        elif s < 0:
            self.pro[(kv, ku)] -= s

    def add_reduction_votes(self, stage_votes: dict[tuple[int, int], tuple[int, int]]) -> None:
        """Add the steps that :func:`dp_end_votes` counted for each pair of stages, each way."""
        for (i, j), (up, down) in stage_votes.items():
            if i < j:
                self.pro[(i, j)] += up
                self.pro[(j, i)] += down

    def net_and_split(self) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
        """(per ordered pair of stages: the votes for it less those against; the votes on the minority
        side, which count against the agreement)."""
        pro = self.pro
        votes = {k: w - pro.get((k[1], k[0]), 0.0) for k, w in pro.items()}
        votes.update({(j, i): -w for (i, j), w in list(votes.items())})
        split = {k: min(w, pro.get((k[1], k[0]), 0.0)) for k, w in pro.items()}
        split.update({(j, i): m for (i, j), m in list(split.items())})
        return votes, split


def _vote_direction_lags(tally: _StageTally, pe: pl.DataFrame, resolution_ns: int, exporter_skew_ns: int,
                         undated: set[frozenset]) -> None:
    """Vote on each pipeline link whose two directions started clearly apart: the activations' direction
    starts first, so its sender is upstream. ``pe``: the pipeline edges (a, b, first_ab, first_ba,
    same_clock when present); ``undated`` links' first records date their connections, and do not vote."""
    same = pe["same_clock"].to_list() if "same_clock" in pe.columns else [None] * pe.height
    for (a, b, fa, fb), sc in zip(pe.select("a", "b", "first_ab", "first_ba").iter_rows(), same):
        if (fa is None or fb is None or frozenset((a, b)) in undated
                or abs(fa - fb) <= lag_floor_ns(resolution_ns, sc, exporter_skew_ns)):
            continue
        tally.vote(a, b, 1.0 if fa < fb else -1.0)  # a's traffic to b started first: a is upstream


def _vote_link_chronology(tally: _StageTally, path: list[str], links: list[frozenset], link_first: dict,
                          link_last: dict, apart: int) -> None:
    """Vote along one pipeline walk (``path``, its ``links`` in walk order) from consecutive links' times:
    a later first payload, or an earlier last record, on the next link says the walk runs downstream.
    Times less than ``apart`` apart are no vote."""
    # consecutive links x=(u,v), y=(v,w) along the walk: later first / earlier last on y says u->v->w
    for i in range(len(links) - 1):
        u, v = path[i], path[i + 1]
        s = 0.0
        f1, f2 = link_first.get(links[i]), link_first.get(links[i + 1])
        if f1 is not None and f2 is not None and abs(f2 - f1) >= apart:
            s += 1.0 if f2 > f1 else -1.0
        l1, l2 = link_last.get(links[i]), link_last.get(links[i + 1])
        if l1 is not None and l2 is not None and abs(l2 - l1) >= apart:
            s += 1.0 if l2 < l1 else -1.0
        if s:
            tally.vote(u, v, s)
            tally.vote(v, path[(i + 2) % len(path)], s)


def _vote_ends_from_wrap(tally: _StageTally, path: list[str], links: list[frozenset], link_last: dict,
                         link_bytes: dict) -> None:
    """Vote round one pipeline cycle (``path``, its ``links`` in walk order) whose last records end in
    order round it from its short link (fabric.tie_evidence): the last backward pass leaves the wrap
    first and each link upstream later, so the direction the ends rise in is upstream. Two votes a link:
    over TCP each link's first record opens with its connection, in any order, and those first-time
    votes must not outweigh this."""
    w = wrap_by_bytes(path, link_bytes)
    ends = [link_last.get(x) for x in links]
    walk = ends_from_wrap(np.array(ends, float), w) if w is not None and None not in ends else None
    if walk is None:
        return
    n = len(path)
    for i in range(n):
        if i != w:
            u, v = path[i], path[(i + 1) % n]
            if walk > 0:  # the ends rise going forward: forward is upstream
                u, v = v, u
            tally.vote(u, v, 2.0)


def _walks(pipelines: list[list[str]], pe: pl.DataFrame) -> list[tuple[list[str], list[str], bool]]:
    """Per pipeline: (its members as the fit listed them, the members in link order along the pipeline
    edges ``pe``, whether they close into a cycle)."""
    adj: dict[str, list[str]] = defaultdict(list)
    for a, b in pe.select("a", "b").iter_rows():
        adj[a].append(b)
        adj[b].append(a)
    return [(p, *_walk(p, adj)) if len(p) > 1 else (p, p, False) for p in pipelines]


def _orient(walks: list[tuple[list[str], list[str], bool]], votes: dict[tuple[int, int], float],
            stage_key: dict[str, int], dp_groups: list[list[str]]) -> tuple[list[tuple], int]:
    """(the walks, each turned to run the way its stages' net ``votes`` say; how many pipelines no vote
    reached). When any is unvoted, all follow the address rule below instead of their votes."""
    # the lowest address of each stage (DP group): with no vote, every pipeline starts from the end
    # whose stage holds the lower one, so that all run the same way through the stages (one grid);
    # rail copies agree where hosts number their NICs alike on every rail (as strategy.flows.infer's TP
    # groups assume). Walking each from its own lowest address would orient them at random once
    # addresses do not follow ranks.
    low = {stage_key[g[0]]: address_key(min(g, key=address_key)) for g in dp_groups}
    nets = [sum(votes.get((stage_key[u], stage_key[v]), 0.0)
                for u, v in zip(path, path[1:] + ([path[0]] if cyclic else []))) for _, path, cyclic in walks]
    # a pipeline that no vote reached runs the way the address rule guesses; the voted ones may then run
    # the other way through the stages, and the report claims that its pipelines run alike: when any
    # pipeline is unvoted, all follow the address rule (and no direction is claimed)
    guessed = sum(1 for (p, _, _), net in zip(walks, nets) if len(p) > 1 and net == 0)
    oriented = []
    for (p, path, cyclic), net in zip(walks, nets):
        if len(p) > 1:
            if guessed:
                net = 0.0
            if net == 0 and not cyclic:
                net = -1.0 if low[stage_key[path[-1]]] < low[stage_key[path[0]]] else 1.0
            elif net == 0:
                i = min(range(len(path)), key=lambda k: low[stage_key[path[k]]])
                before, after = path[i - 1], path[(i + 1) % len(path)]
                net = -1.0 if low[stage_key[before]] < low[stage_key[after]] else 1.0
            if net < 0:
                path = path[::-1]
        oriented.append((p, path, cyclic))
    return oriented, guessed


def _pooled_wrap_scores(oriented: list[tuple], stage_key: dict[str, int], link_first: dict, link_last: dict,
                        link_bytes: dict) -> tuple[dict[frozenset, float], dict[frozenset, int]]:
    """(per pair of stages: how much their link looks like the wrap, summed over the cyclic pipelines;
    how many pipelines added to it). Every pipeline wraps between the same two stages: pooling the
    evidence keeps one exporter's clock offset on one link from moving the cut."""
    wrap: dict[frozenset, float] = defaultdict(float)
    pooled: dict[frozenset, int] = defaultdict(int)
    for _, path, cyclic in oriented:
        if cyclic:
            scores = _wrap_scores(path, link_first, link_last)
            # one link short by a model chunk both ways is the wrap whatever the clocks say
            # (fabric.tie_evidence): it outweighs both time ranks together (at most 2 n apart)
            short = wrap_by_bytes(path, link_bytes)
            if short is not None:
                scores[short] += 4.0 * len(path)
            for i, sc in enumerate(scores.tolist()):
                key = frozenset((stage_key[path[i]], stage_key[path[(i + 1) % len(path)]]))
                wrap[key] += sc
                pooled[key] += 1
    return wrap, pooled


def _cut_cycle(path: list[str], wrap: dict[frozenset, float], pooled: dict[frozenset, int],
               stage_key: dict[str, int]) -> tuple[list[str], bool]:
    """(the oriented cycle ``path`` cut after its most wrap-like link, so it runs first stage to last;
    whether that cut is a guess)."""
    n = len(path)
    sc = [wrap[frozenset((stage_key[path[i]], stage_key[path[(i + 1) % n]]))] for i in range(n)]
    i = int(np.argmax(sc))
    # when both link times agree, the wrap outscores its upstream neighbour by 2 per pipeline
    # pooled; less means one of them disagrees or ties (millisecond clocks): a guess
    npool = pooled[frozenset((stage_key[path[i]], stage_key[path[(i + 1) % n]]))]
    unclear = sc[i] - sorted(sc)[-2] < 2 * max(npool, 1)
    return path[i + 1:] + path[:i + 1], unclear


def _cut_and_agree(oriented: list[tuple], wrap: dict[frozenset, float], pooled: dict[frozenset, int],
                   votes: dict[tuple[int, int], float], split: dict[tuple[int, int], float],
                   stage_key: dict[str, int]) -> tuple[list[list[str]], float]:
    """(the pipelines first stage to last, cycles cut at their wrap; the share of the votes along them
    that agree with that order, halved in proportion to the cycles cut at a guessed link)."""
    out, agree, total, cycles, unclear = [], 0.0, 0.0, 0, 0
    for p, path, cyclic in oriented:
        if len(p) == 1:
            out.append(p)
            continue
        if cyclic:
            path, guess = _cut_cycle(path, wrap, pooled, stage_key)
            cycles += 1
            unclear += int(guess)
        for u, v in zip(path, path[1:]):
            w = votes.get((stage_key[u], stage_key[v]), 0.0)
            m = split.get((stage_key[u], stage_key[v]), 0.0)
            agree += max(w, 0.0) + m
            total += abs(w) + 2 * m
        out.append(path)
    share = agree / total if total else 0.0
    # a cycle cut at a guessed link has the right neighbours but maybe the wrong first stage
    share *= 1.0 - 0.5 * (unclear / cycles if cycles else 0.0)
    return out, share
