"""The OSDI'25 op-level what-if model: records with OSDI op types (the whatif_parquet importer).

One model-parallel group's ops in one step form a template of edges and sync
groups (:func:`_osdi_template`); every (step, dp rank) instance shares it. See
:mod:`rankscope.analysis.whatif.graph` for the graph and its replay semantics.
"""

from __future__ import annotations

from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.whatif.graph import (
    BWD,
    CLOCK_ERROR_NS,
    FWD,
    Template,
    WhatIfGraph,
    WhatIfInputError,
)
from rankscope.collectors.record_class import record

P2P_TYPES = ("forward-send", "forward-recv", "backward-send", "backward-recv")
DP_COMM_TYPES = ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce")
COMM_TYPES = P2P_TYPES + DP_COMM_TYPES + (
    "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "optimizer-clip-main-grad")
"""Op types that are communication for the ideal (median transfer); the rest are compute (mean)."""
END_TYPE = "optimizer"
"""The op type whose end closes a step."""

_EPS_MATCH_NS = 5e-5 * 1e9
"""Clock slack when matching p2p ops to computes (the authors' 50 us)."""


def osdi_ops(comp: pl.DataFrame, comm: pl.DataFrame) -> pl.DataFrame:
    cols = ["rank", "dp_rank", "stage", "step", "optype", "seq", "microbatch", "start_ns", "end_ns"]
    c = _typed_rows(comp, cols)
    m = _typed_rows(comm, cols) if comm.height else c.clear()
    # one chunk per column: the two-chunk columns of a plain concat are gathered into one again by each
    # filter and each to_numpy of the graph's build and of every section that reads the graph
    # the op type as a category (4 bytes an op, not a string's 13-16), step and seq as int32 where they fit:
    # ~35 MB less per copy at 1.9 M ops, and the graph's ops, the sections' filters of them and their evidence
    # frames all carry them
    ops = pl.concat([c, m.cast(c.schema)], rechunk=True)
    ops = ops.with_columns(
        pl.col("optype").cast(pl.Categorical), *_narrowed(ops, "step", "seq"),
        pl.col("start_ns").cast(pl.Float64), pl.col("end_ns").cast(pl.Float64),
        pl.col("dp_rank").fill_null(0), pl.col("stage").fill_null(0))
    # an op without step or sequence number has no place in the model (the importer never writes one);
    # without one, no filter (it would copy every column to keep every row)
    if ops["step"].null_count() == 0 and ops["seq"].null_count() == 0:
        return ops
    return ops.filter(pl.col("step").is_not_null() & pl.col("seq").is_not_null())


def _narrowed(ops: pl.DataFrame, *cols: str) -> list[pl.Expr]:
    """``cols`` of ``ops`` cast to int32 where every value fits (nulls kept), else as they are."""
    bounds = ops.select(*(pl.col(c).min().alias(f"lo_{c}") for c in cols),
                        *(pl.col(c).max().alias(f"hi_{c}") for c in cols)).row(0)
    lo, hi = bounds[:len(cols)], bounds[len(cols):]
    return [pl.col(c).cast(pl.Int32) if (a is None or a >= -2**31) and (b is None or b < 2**31) else pl.col(c)
            for c, a, b in zip(cols, lo, hi, strict=True)]


def _typed_rows(df: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
    """``cols`` of the rows with an OSDI op type. Selected before filtered, and not filtered when every row has
    one: a filter copies every column it carries (comm_op's ~25 of the 1.1 M collectives of the OSDI'25 AR
    trace tiled 16x: ~120 MB of pages polars' allocator keeps for a while)."""
    df = df.select(cols)
    return df if df["optype"].null_count() == 0 else df.filter(pl.col("optype").is_not_null())


def _chain(edges: list, ids: list) -> None:
    edges.extend(zip(ids[:-1], ids[1:], strict=True))


def _null_first(x) -> tuple:
    """A sort key that puts None first, as polars sorts nulls."""
    return (x is not None, x if x is not None else 0.0)


def _stage_rows(t: pl.DataFrame) -> dict[int, list[tuple]]:
    """Each stage's template ops as (tid, optype, seq, start_ns, end_ns), in template (tid) order.

    A template holds a few hundred ops: plain lists beat a polars filter and sort per op type and stage
    (~100 of them, two thirds of the template's build on the OSDI'25 AR trace)."""
    by_stage: dict[int, list[tuple]] = {}
    cols = [t[c].to_list() for c in ("stage", "tid", "optype", "seq", "start_ns", "end_ns")]
    for stage, *row in zip(*cols, strict=True):
        by_stage.setdefault(stage, []).append(tuple(row))
    return by_stage


def _by(rows: list[tuple], col: int) -> list[tuple]:
    """``rows`` sorted on one field (stable, nulls first)."""
    return sorted(rows, key=lambda r: _null_first(r[col]))


def _ids(rows: list[tuple], *optypes: str) -> list[int]:
    return [r[0] for r in rows if r[1] in optypes]


def _p2p_in_window(ops: list[tuple], computes: list[tuple], sr: str) -> list[bool]:
    """Per p2p op of ``ops`` (rows of one send or recv op type): whether it can belong to one of the
    ``computes`` (rows of the matching compute type), with the authors' clock slack: a recv starts no
    later than the last compute starts, a send ends no earlier than the first compute ends."""
    if sr == "recv":
        last_start = max((r[3] for r in computes if r[3] is not None), default=None)
        return [r[3] is not None and last_start is not None and r[3] <= last_start + _EPS_MATCH_NS for r in ops]
    first_end = min((r[4] for r in computes if r[4] is not None), default=None)
    return [r[4] is not None and first_end is not None and r[4] >= first_end - _EPS_MATCH_NS for r in ops]


@record(frozen=False)
class _TemplateBuild:
    """The edges and sync groups of one template, gathered stage by stage, in template ids.

    ``key``: (optype, seq, stage) -> template id. ``separate_ar``: the step has a separate gradient
    all-reduce (the reduce-scatter then overlaps the backward pass). Rows of a stage are
    (tid, optype, seq, start_ns, end_ns), as :func:`_stage_rows` gives them.
    """

    key: dict
    pp: int
    use_dp: bool
    separate_ar: bool
    edges: list = field(default_factory=list)
    """(u, v): v waits for u."""
    groups: list = field(default_factory=list)
    """(members, dp_sync)."""
    pair_members: dict = field(default_factory=dict)
    """(send side, recv side) -> the ops found for that p2p pair; a pair is whole with two."""
    notes: dict = field(default_factory=lambda: {"unpaired_p2p": 0})

    def add_stage(self, s: int, rows: list[tuple]) -> None:
        """Every edge within stage ``s`` and its lone and dp-synced groups; its p2p ops join pair_members."""
        # (start_ns, seq, optype) is unique within a stage, so this order is the only one
        ordered = sorted(rows, key=lambda r: (_null_first(r[3]), _null_first(r[2]), r[1]))
        by_seq = _by(rows, 2)
        comp = [r for r in ordered if r[1] in (FWD, BWD)]
        _chain(self.edges, [r[0] for r in comp])
        p2p = [r for r in ordered if r[1] in P2P_TYPES]
        self.link_p2p(s, comp, p2p)
        for optype in P2P_TYPES:
            _chain(self.edges, _ids(p2p, optype))
        self.link_first_backward_p2p(s, comp)
        rs = _ids(by_seq, "grads-reduce-scatter")
        if self.use_dp:
            self.link_dp_comm(ordered, by_seq, comp, rs)
        self.link_step_end(s, comp, rs)
        if self.use_dp:
            for i in _ids(rows, *DP_COMM_TYPES):
                self.groups.append(([i], True))

    def link_p2p(self, s: int, comp: list[tuple], p2p: list[tuple]) -> None:
        """Ties stage ``s``'s sends and recvs (rows ``p2p``) to its computes (``comp``), per direction."""
        for direction, delta_send in (("forward", 1), ("backward", -1)):
            computes = [r for r in comp if r[1] == f"{direction}-compute"]
            if not computes:
                continue
            for sr in ("send", "recv"):
                ops = [r for r in p2p if r[1] == f"{direction}-{sr}"]
                if ops:
                    self.link_p2p_type(s, direction, delta_send, sr, ops, computes)

    def link_p2p_type(self, s: int, direction: str, delta_send: int, sr: str, ops: list[tuple],
                      computes: list[tuple]) -> None:
        """The ops of one p2p type (``direction``-``sr``) of stage ``s``, in start order. One in the
        compute window is tied to the next compute by sequence number (a send waits for it; it waits for
        a recv, which waits for the compute before) and, unless the peer stage does not exist, pairs with
        the peer stage's k-th op of the opposite type; the others start alone."""
        valid = _p2p_in_window(ops, computes, sr)
        cid = 1 if (sr == "recv" and sum(valid) + 1 == len(computes)) else 0
        peer_stage = s + (delta_send if sr == "send" else -delta_send)
        noop_peer = peer_stage < 0 or peer_stage >= self.pp
        optype = f"{direction}-{sr}"
        peer_type = f"{direction}-{'recv' if sr == 'send' else 'send'}"
        k = 0
        for op_id, ok in zip([r[0] for r in ops], valid, strict=True):
            match = self.key.get((f"{direction}-compute", cid, s)) if ok else None
            if match is not None:
                if sr == "send":
                    self.edges.append((match, op_id))
                else:
                    self.edges.append((op_id, match))
                    prev = self.key.get((f"{direction}-compute", cid - 1, s))
                    if prev is not None:
                        self.edges.append((prev, op_id))
                cid += 1
            if not ok or noop_peer:
                self.groups.append(([op_id], False))
                continue
            pair = tuple(sorted([(optype, k, s), (peer_type, k, peer_stage)]))
            self.pair_members.setdefault(pair, []).append(op_id)
            k += 1

    def link_first_backward_p2p(self, s: int, comp: list[tuple]) -> None:
        """The first backward recv and send of stage ``s`` wait for the compute two before its first backward."""
        first_bwd = next((i for i, r in enumerate(comp) if r[1] == BWD), None)
        if first_bwd is not None and first_bwd >= 2:
            for optype in ("backward-recv", "backward-send"):
                op = self.key.get((optype, 0, s))
                if op is not None:
                    self.edges.append((comp[first_bwd - 2][0], op))

    def link_dp_comm(self, ordered: list[tuple], by_seq: list[tuple], comp: list[tuple], rs: list[int]) -> None:
        """A stage's dp communication: gathers and reduce-scatters in start order, the first forward after
        the last parameter gather, and (with a separate all-reduce) the first reduce-scatter after the last
        backward to end. ``rs``: the reduce-scatters by sequence number."""
        _chain(self.edges, _ids(ordered, "params-all-gather", "grads-reduce-scatter"))
        ag = _ids(by_seq, "params-all-gather")
        fwd = [r for r in comp if r[1] == FWD]
        if ag and fwd:
            self.edges.append((ag[-1], _by(fwd, 3)[0][0]))
        if self.separate_ar and rs:
            self.edges.append((_by([r for r in comp if r[1] == BWD], 4)[-1][0], rs[0]))

    def step_tail(self, s: int, rs: list[int]) -> list[int]:
        """Stage ``s``'s ops after its computes, in the order they run: gradient all-reduces (layernorm,
        embedding on the first and last stage, the dp reduction), the gradient clip, the optimizer."""
        key = self.key
        tail = [key.get(("layernorm-grads-all-reduce", 0, s))]
        if s in (0, self.pp - 1):
            tail.append(key.get(("embedding-grads-all-reduce", 0, s)))
        if self.use_dp and self.separate_ar:
            tail.append(key.get(("separate-grads-all-reduce", 0, s)))
        elif self.use_dp:
            tail.extend(rs)
        tail += [key.get(("optimizer-clip-main-grad", 0, s)), key.get(("optimizer", 0, s))]
        return [x for x in tail if x is not None]

    def link_step_end(self, s: int, comp: list[tuple], rs: list[int]) -> None:
        """Chains stage ``s``'s gc and step tail after the compute that ends last (with a separate
        all-reduce, the tail also waits for the last reduce-scatter)."""
        tail = self.step_tail(s, rs)
        gc = self.key.get(("gc", 0, s))
        if comp:
            last = _by(comp, 4)[-1][0]
            head = gc if gc is not None else (tail[0] if tail else None)
            if head is not None:
                self.edges.append((last, head))
        _chain(self.edges, ([gc] if gc is not None else []) + tail)
        if self.use_dp and self.separate_ar and rs and tail:
            self.edges.append((rs[-1], tail[0]))

    def add_cross_stage_groups(self) -> None:
        """The groups that span stages: p2p pairs (a side without its peer starts alone and is counted in
        notes), the embedding all-reduce of the first and last stage, the gradient clip of every stage."""
        key, pp = self.key, self.pp
        for members in self.pair_members.values():
            if len(members) == 2:
                self.groups.append((members, False))
            else:
                self.notes["unpaired_p2p"] += len(members)
                self.groups.extend(([m], False) for m in members)
        emb = [key.get(("embedding-grads-all-reduce", 0, s)) for s in sorted({0, pp - 1})]
        emb = [x for x in emb if x is not None]
        if emb:
            self.groups.append((emb, False))
        clip = [key.get(("optimizer-clip-main-grad", 0, s)) for s in range(pp)]
        clip = [x for x in clip if x is not None]
        if clip:
            self.groups.append((clip, True))


def _osdi_template(t: pl.DataFrame, pp: int, use_dp: bool) -> tuple[list, list, dict]:
    """Edges and sync groups among the ops of one model-parallel group in one step.

    ``t``: rows with tid, optype, seq, stage, start_ns, end_ns. Returns
    (edges [(u, v)], groups [(members, dp_sync)], notes) in template ids.
    """
    key = {(o, s, st): i for i, o, s, st in zip(t["tid"], t["optype"], t["seq"], t["stage"], strict=True)}
    build = _TemplateBuild(key, pp, use_dp, "separate-grads-all-reduce" in set(t["optype"].to_list()))
    stages = _stage_rows(t)
    for s in range(pp):
        build.add_stage(s, stages.get(s, []))
    build.add_cross_stage_groups()
    return build.edges, build.groups, build.notes


def _index_type(n: int) -> type:
    """int32 for ids below ``n`` where they fit: the graph's per-op and per-edge id arrays (~1.9 M ops and 3.5 M
    edges on the OSDI'25 AR trace tiled 16x) live through the whole what-if and critical path."""
    return np.int32 if n < 2**31 - 1 else np.int64


def _type_codes(optype: pl.Series, types: list[str]) -> np.ndarray:
    """Per op its op type's place in ``types`` (int64), -1 for a null or another type: an Enum cast (a byte a
    row), not a join or a string column per branch."""
    return optype.cast(pl.Enum(types), strict=False).to_physical().cast(pl.Int64).fill_null(-1).to_numpy()


def _op_type_codes(optype: pl.Series) -> tuple[list[str], np.ndarray]:
    """(the op types present, first seen first; each op's place among them, -1 for a null)."""
    types = [x for x in optype.unique(maintain_order=True).to_list() if x is not None]
    return types, _type_codes(optype, types)


def _template_ids(ops: pl.DataFrame, t: pl.DataFrame, types: list[str], code: np.ndarray) -> np.ndarray:
    """Per op (in ``ops``' order) its template id by (optype, seq, stage), -1 for an op the template does not
    have (the template's keys are unique). ``code``: each op's op type's place in ``types`` (:func:`_type_codes`). A search of each op's packed key among the template's few hundred,
    not a join: polars' join of 1.9 M rows on three keys (a string among them) allocated ~150 MB, pages its
    allocator then keeps for a while."""
    if t.is_empty():
        return np.full(ops.height, -1, dtype=np.int64)
    t_seq, t_stage = t["seq"].to_numpy(), t["stage"].to_numpy()
    s_lo, g_lo = int(t_seq.min()), int(t_stage.min())
    s_w, g_w = int(t_seq.max()) - s_lo + 1, int(t_stage.max()) - g_lo + 1
    if len(types) * s_w * g_w >= 2**62:  # keys too wide to pack (never seen): the join
        keys = ["optype", "seq", "stage"]
        return ops.select(keys).join(t.select(*keys, "tid"), on=keys, how="left",
                                     maintain_order="left")["tid"].fill_null(-1).to_numpy()

    def packed(code: np.ndarray, seq: np.ndarray, stage: np.ndarray) -> np.ndarray:
        """(code, seq, stage) as one int64 in the template's ranges (-1 outside them or for a null)."""
        seq, stage = seq.astype(np.int64) - s_lo, stage.astype(np.int64) - g_lo
        ok = (code >= 0) & (seq >= 0) & (seq < s_w) & (stage >= 0) & (stage < g_w)
        return np.where(ok, (code * s_w + seq) * g_w + stage, -1)

    t_key = packed(_type_codes(t["optype"], types), t_seq, t_stage)
    order = np.argsort(t_key)
    sorted_key = t_key[order]
    # the key columns have no nulls here (osdi_ops drops ops without seq and fills stage); a null would
    # match nothing, as in a join
    seq, stage = (ops[c].fill_null(s_lo - 1 if c == "seq" else g_lo - 1).to_numpy() for c in ("seq", "stage"))
    key = packed(code, seq, stage)
    del seq, stage
    pos = np.minimum(np.searchsorted(sorted_key, key), sorted_key.size - 1)
    found = (key >= 0) & (sorted_key[pos] == key)
    return np.where(found, t["tid"].to_numpy()[order[pos]], -1)


def _stream(types: list[str], code: np.ndarray) -> pl.Series:
    """Per op its stream (``code``: its op type's place in ``types``, -1 for a null): a p2p op type is its own,
    then dp-comm, collective, compute (by :data:`P2P_TYPES`, :data:`DP_COMM_TYPES`, :data:`COMM_TYPES`).
    Gathered from one string per op type, not a when/then chain that builds a full string column per branch
    (~70 MB of pages at 1.9 M ops)."""
    names = pl.Series("stream", [x if x in P2P_TYPES else "dp-comm" if x in DP_COMM_TYPES
                                 else "collective" if x in COMM_TYPES else "compute" for x in types] + ["compute"],
                      dtype=pl.Categorical)
    # a null op type is compute, as the chain's otherwise
    return names.gather(np.where(code < 0, len(types), code))


def osdi_graph(ops: pl.DataFrame) -> WhatIfGraph:
    steps = np.sort(ops["step"].unique().to_numpy())
    dp = int(ops["dp_rank"].max()) + 1
    pp = int(ops["stage"].max()) + 1
    # the index of each op's step among the sorted steps: a search in ~50 values, not a rank over all ops
    ops = ops.with_columns(pl.Series("step_index", np.searchsorted(steps, ops["step"].to_numpy()), dtype=pl.Int32))
    # The template: one model-parallel group (dp rank 0) in the first step; every (step, dp rank) shares it.
    t = ops.filter((pl.col("dp_rank") == 0) & (pl.col("step") == steps[0])).unique(
        ["optype", "seq", "stage"], keep="first", maintain_order=True).with_row_index("tid")
    t = t.with_columns(pl.col("tid").cast(pl.Int64))
    use_dp = dp > 1
    edges, groups, notes = _osdi_template(t, pp, use_dp)
    # each op's type as a code, once: the template ids and the stream both read it (an Enum cast of 1.9 M
    # strings is ~0.1 s)
    types, code = _op_type_codes(ops["optype"])
    tid = _template_ids(ops, t, types, code)
    outside = tid < 0
    notes["ops_outside_model"] = int(outside.sum())
    if notes["ops_outside_model"]:
        ops, tid, code = ops.filter(pl.Series(~outside)), tid[~outside], code[~outside]
    del outside
    n_inst = len(steps) * dp
    inst = (ops["step_index"].cast(pl.Int64) * dp + ops["dp_rank"].cast(pl.Int64)).to_numpy()
    n_t = t.height
    idx = _index_type(ops.height)
    rows = np.full((n_inst, n_t), -1, dtype=idx)
    rows[inst, tid] = np.arange(ops.height, dtype=idx)
    del inst, tid
    complete = (rows >= 0).all(axis=1)
    if not complete.all():
        # an incomplete (step, dp rank) would leave dangling dependencies: drop its whole step
        bad_steps = np.unique(np.flatnonzero(~complete) // dp)
        notes["steps_dropped_incomplete"] = [int(steps[i]) for i in bad_steps]
        keep = ~np.isin(ops["step_index"].to_numpy(), bad_steps)
        if not keep.any():
            raise WhatIfInputError("no step has every op of the dependency model on every dp rank")
        ops = ops.filter(pl.Series(keep))
        return osdi_graph(ops.drop("step_index"))
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    # np.take lays the (instances x edges) result out row-major: ravel is then no second copy
    src = np.take(rows, e[:, 0], axis=1).ravel()
    dst = np.take(rows, e[:, 1], axis=1).ravel()
    group = np.full(ops.height, -1, dtype=_index_type(len(groups) * n_inst))
    step_idx = ops["step_index"].to_numpy()
    dp_rank = ops["dp_rank"].to_numpy().astype(np.int64)
    for gid, (members, dp_sync) in enumerate(groups):
        for m in members:
            r = rows[:, m]
            # dp-synced groups span all dp ranks of a step; others stay within their dp rank
            local = step_idx[r] if dp_sync else step_idx[r] * dp + dp_rank[r]
            group[r] = gid * n_inst + local
    synced = group >= 0
    start = ops["start_ns"].to_numpy()
    end = ops["end_ns"].to_numpy()
    latest = np.full(group.max() + 1 if synced.any() else 0, -np.inf)
    np.maximum.at(latest, group[synced], start[synced])
    transfer = end - np.where(synced, latest[np.where(synced, group, 0)], start)
    transfer = np.where(synced & (transfer <= -CLOCK_ERROR_NS), 0.0, transfer)
    actual = np.where(synced, transfer, end - start)
    ops = ops.with_columns(
        pl.Series("synced", synced), pl.col("optype").is_in(list(COMM_TYPES)).alias("comm"),
        _stream(types, code), pl.Series("actual", actual))
    notes.update(dp=dp, pp=pp, template_ops=n_t)
    tmpl = Template(rows=rows, src=e[:, 0].copy(), dst=e[:, 1].copy(),
                    groups=tuple((tuple(m), d) for m, d in groups), n_steps=len(steps), dp=dp)
    # step_index lives on as the graph's array (a view of the column's buffer), not as a column
    return WhatIfGraph(ops=ops.drop("step_index"), src=src, dst=dst, group=group, step_index=step_idx,
                       steps=steps, model="osdi25", notes=notes, template=tmpl)
