"""Evidence that breaks a tie between labellings that fit the link models equally well.

The tie that matters: an interleaved pipeline (several model chunks per rank) sends the last stage's
output back to the first stage's next chunk, so its stage links close a cycle, and when every link
carries payload both ways about evenly (activations one way, gradients back) that cycle fits a
collective's shape too (a ring or tree all-reduce of the same members). Over TCP with exporter
timeouts longer than the capture a link is one record per direction, so the direction lag
(fabric.link_evidence) cannot be measured and both labellings score alike.

What still tells them apart is in the bytes and the record ends, from the two traffic models:

- *one link short by a chunk*: every micro-batch crosses each stage boundary once per model chunk
  (``v`` times each way), except the wrap link (last rank back to first), crossed ``v - 1`` times;
  so one link of the cycle carries ``(v - 1) / v`` of the others' bytes (half for ``v = 2``) in
  both directions, and the others carry the same. A collective moves the same bytes over every link
  of its group (ring all-reduce: ``2 (n - 1) / n`` of the gradients each), so none of its links is
  short, and a pipeline that is a path has no wrap;
- *the last backward pass walks round the cycle*: the last micro-batch's gradients leave the wrap
  link first and each next link upstream later, so the links' last records end in order round the
  cycle, earliest on the wrap. A collective's links all end within its last exchange, in an order
  round the ring that is as good as random (``2n / n!`` to rise like this: < 2 % for 6 links).
  Only a check here: it is read when the clock resolves it and must agree with the bytes.

- *no pipeline has two short links*: a labelling that makes a pipeline of a cycle in which two links
  carry clearly fewer bytes than the rest, both ways, fits no schedule (a double binary tree's links
  carry twice the bytes where its two trees share a link, and its union of links holds cycles).

A tie is broken when exactly one of the tied labellings has cyclic pipelines and each of them shows
its short link (and no record ends contradict it), or else when all tied labellings but one make
such misfit cycles; otherwise the tie stands.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.collectors.record_class import record

NOISE_MULTIPLE = 3.0
"""the short link must fall below the median of the cycle's other links by this many times their own
largest deviation from it (sampling and ACK noise), so that noise among equal links is never read as a
missing chunk."""
MAX_CHUNKS = 8
"""most model chunks per rank looked for: the short link carries (v - 1) / v, so a shortfall under
1 / MAX_CHUNKS of the others is not read as a wrap (Megatron's virtual pipeline sizes are a few)."""

HALF_SLACK = 0.05
"""how far past one half the short link may fall (v = 2 carries exactly half in expectation; its own
sampling noise and per-message headers move it either way): a link short by far more than half is a
lost or cut record, not a missing chunk."""


@record
class TieBreak:
    winner: int | None
    """index into the tied labellings of the one the evidence prefers (None: the tie stands)."""
    evidence: str
    """what decided it, or why nothing did."""
    chunks: int | None = None
    """model chunks per rank read from the short link's share (1 / (1 - share), rounded)."""
    kind: str = ""
    """``wrap``: the winner's cycles each show one short link; ``misfit``: the others' pipeline cycles
    fit no pipeline schedule; empty when the tie stands."""


def cycle_links(members: list[str], ea: list[str], eb: list[str]) -> list[tuple[int, bool]] | None:
    """The links of one pipeline that closes a cycle, in order round it: (link index, True when the
    link's a -> b runs the walking direction). None when the pipeline's links are not one cycle."""
    if len(ea) != len(members) or len(members) < 3:
        return None
    at: dict[str, list[int]] = {x: [] for x in members}
    for i, (a, b) in enumerate(zip(ea, eb)):
        if a not in at or b not in at:
            return None
        at[a].append(i)
        at[b].append(i)
    if any(len(v) != 2 for v in at.values()):
        return None
    out, cur, used = [], members[0], set()
    for _ in range(len(members)):
        i = next((j for j in at[cur] if j not in used), None)
        if i is None:
            return None
        used.add(i)
        fwd = ea[i] == cur
        out.append((i, fwd))
        cur = eb[i] if fwd else ea[i]
    return out if cur == members[0] and len(used) == len(members) else None


def direction_noise(along: np.ndarray, back: np.ndarray) -> float:
    """The links' own measurement noise: in both models each link of the cycle carries the same bytes
    both ways (activations and gradients of one boundary; a tree's reduce and broadcast), so the
    largest relative gap between a link's two directions, over sqrt 2 (two noisy readings), is what
    sampling and transport noise can do to one reading; 0 when not all readings are positive."""
    if len(along) == 0 or (along <= 0).any() or (back <= 0).any():
        return 0.0
    return float(np.max(np.abs(np.log(along / back)))) / np.sqrt(2.0)


def short_link(v: np.ndarray, noise: float = 0.0) -> tuple[int, float] | None:
    """(position, share of the others' median) of the one link well short of the rest, or None.
    ``noise``: a floor for the others' spread (:func:`direction_noise`), which few links may hide."""
    if len(v) < 3 or not np.isfinite(v).all() or (v <= 0).any():
        return None
    i = int(np.argmin(v))
    rest = np.delete(v, i)
    med = float(np.median(rest))
    spread = max(float(np.max(np.abs(rest / med - 1.0))), noise)
    shortfall = 1.0 - float(v[i]) / med
    # a chunk short: between 1 / MAX_CHUNKS and one half (v >= 2), clear of the others' noise
    ok = (1.0 / MAX_CHUNKS <= shortfall <= 0.5 + max(NOISE_MULTIPLE * spread, HALF_SLACK)
          and shortfall > NOISE_MULTIPLE * spread)
    return (i, 1.0 - shortfall) if ok else None


def ends_walk(t: np.ndarray) -> int | None:
    """Position of the earliest-ending link when the ends rise link after link round the cycle with one
    drop (strictly: equal ends, as coarse clocks give, show nothing), else None."""
    if len(t) < 3 or not np.isfinite(t).all():
        return None
    d = np.diff(np.r_[t, t[0]])
    up, down = int((d > 0).sum()), int((d < 0).sum())
    if up + down != len(t) or min(up, down) != 1:
        return None
    return int(np.argmin(t))


def ends_from_wrap(t: np.ndarray, w: int) -> int | None:
    """+1 when the ends of the links after the wrap ``w`` rise link after link going forward round the
    cycle (forward is then upstream), -1 when they fall, None otherwise. The wrap's own end is left
    out: a stray small record on it (another connection, a late ACK) says nothing of the last pass."""
    n = len(t)
    if n < 3 or not np.isfinite(t).all():
        return None
    d = np.diff(t[[(w + 1 + i) % n for i in range(n - 1)]])
    if (d > 0).all():
        return 1
    if (d < 0).all():
        return -1
    return None


def two_short(v: np.ndarray, noise: float = 0.0) -> bool:
    """True when the two lowest links both fall clearly below the rest (as :func:`short_link` reads one):
    no pipeline schedule does that (one wrap per cycle), a double binary tree's cycle of links does
    (links in both trees carry twice the bytes of links in one)."""
    if len(v) < 4 or not np.isfinite(v).all() or (v <= 0).any():
        return False
    o = np.argsort(v)
    rest = v[o[2:]]
    med = float(np.median(rest))
    spread = max(float(np.max(np.abs(rest / med - 1.0))), noise)
    bar = max(NOISE_MULTIPLE * spread, 1.0 / MAX_CHUNKS)
    return bool(1.0 - v[o[1]] / med > bar)


def cycle_wrap(members: list[str], ea: list[str], eb: list[str], bytes_ab: np.ndarray, bytes_ba: np.ndarray,
               last: np.ndarray) -> tuple[str, float | None, bool]:
    """(what the bytes show, the short link's share, record ends agree) for one cyclic pipeline: ``wrap``
    (one link short both ways), ``misfit`` (two links short both ways: no pipeline) or ``none``.

    Both directions are read on their own (activations one way round, gradients the other); they must
    name the same link. The ends agree when they do not walk round the cycle (nothing to say) or, the
    wrap's own end left out, walk from that same link."""
    order = cycle_links(members, ea, eb)
    if order is None:
        return "none", None, True
    idx = np.array([i for i, _ in order])
    fwd = np.array([f for _, f in order])
    along = np.where(fwd, bytes_ab[idx], bytes_ba[idx])
    back = np.where(fwd, bytes_ba[idx], bytes_ab[idx])
    noise = direction_noise(along, back)
    if two_short(along, noise) and two_short(back, noise):
        return "misfit", None, True
    short = short_both_ways(along, back, noise)
    if short is None:
        return "none", None, True
    t = last[idx].astype(float)
    # the ends contradict the short link when they walk round the whole cycle from another link
    agree = ends_walk(t) is None or ends_from_wrap(t, short[0]) is not None
    return "wrap", short[1], agree


def short_both_ways(along: np.ndarray, back: np.ndarray, noise: float) -> tuple[int, float] | None:
    """(position, mean share) of the link that :func:`short_link` finds short in both directions round
    a cycle, or None when a direction shows none or the two name different links."""
    s1, s2 = short_link(along, noise), short_link(back, noise)
    if s1 is None or s2 is None or s1[0] != s2[0]:
        return None
    return s1[0], (s1[1] + s2[1]) / 2


def wrap_by_bytes(path: list[str], sent: dict) -> int | None:
    """Position i of the short link (path[i] - path[i + 1], the last one closing the cycle) of a cyclic
    pipeline, read both ways round, or None; ``sent``: (a, b) -> bytes a sent b."""
    n = len(path)
    if n < 3 or not sent:
        return None
    along = np.array([sent.get((path[i], path[(i + 1) % n])) or 0.0 for i in range(n)], dtype=float)
    back = np.array([sent.get((path[(i + 1) % n], path[i])) or 0.0 for i in range(n)], dtype=float)
    short = short_both_ways(along, back, direction_noise(along, back))
    return None if short is None else short[0]


def break_tie(pipelines_of: list[list[list[str]]], is_pp_of: list[np.ndarray], edges: pl.DataFrame) -> TieBreak:
    """Which of several equally fitting labellings the per-link bytes prefer (see module doc).

    ``pipelines_of[k]`` / ``is_pp_of[k]``: labelling k's pipelines (member lists) and its pipeline-link
    mask over ``edges`` (columns a, b, bytes_ab, bytes_ba, last_link when present).
    """
    ea, eb = edges["a"].to_list(), edges["b"].to_list()
    bab = edges["bytes_ab"].cast(pl.Float64).fill_null(0.0).to_numpy()
    bba = edges["bytes_ba"].cast(pl.Float64).fill_null(0.0).to_numpy()
    last = edges["last_link"].cast(pl.Float64).fill_null(float("nan")).to_numpy() if "last_link" in edges.columns \
        else np.full(edges.height, np.nan)
    explained, shares, misfit, clash = [], [], [], False
    for k, (pipes, is_pp) in enumerate(zip(pipelines_of, is_pp_of)):
        cyc = []
        for p in pipes:
            if len(p) < 3:
                continue
            sel = np.flatnonzero(is_pp & np.isin(ea, p) & np.isin(eb, p))
            if len(sel) != len(p):
                continue
            cyc.append(cycle_wrap(p, [ea[i] for i in sel], [eb[i] for i in sel], bab[sel], bba[sel], last[sel]))
        if any(c[0] == "misfit" for c in cyc):
            misfit.append(k)
        elif cyc and all(c[0] == "wrap" for c in cyc):
            if not all(c[2] for c in cyc):
                clash = True
                continue
            explained.append(k)
            shares.append(float(np.mean([c[1] for c in cyc])))
    if clash:
        return TieBreak(None, "a short link, but the last records end in another order round the cycle")
    if len(explained) == 1:
        share = shares[0]
        return TieBreak(explained[0], f"one link of each pipeline cycle carries {share:.2f} of the others' bytes "
                                      f"both ways: the wrap of an interleaved schedule with "
                                      f"{round(1 / (1 - share))} model chunks per rank, which no collective shows",
                        chunks=int(round(1 / (1 - share))), kind="wrap")
    rest = [k for k in range(len(pipelines_of)) if k not in misfit]
    if explained or not misfit or len(rest) != 1:
        return TieBreak(None, "several labellings show a short link" if explained
                        else "no link of a cycle is short by a model chunk")
    return TieBreak(rest[0], "the other labelling(s) make pipeline cycles of links two of which carry clearly "
                             "fewer bytes than the rest both ways, which no pipeline schedule does (one wrap a "
                             "cycle) and a double binary tree does", kind="misfit")
