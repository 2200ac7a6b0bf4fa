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
    c = comp.filter(pl.col("optype").is_not_null()).select(cols)
    m = comm.filter(pl.col("optype").is_not_null()).select(cols) if comm.height else c.clear()
    ops = pl.concat([c, m.cast(c.schema)]).with_columns(
        pl.col("start_ns").cast(pl.Float64), pl.col("end_ns").cast(pl.Float64),
        pl.col("dp_rank").fill_null(0), pl.col("stage").fill_null(0))
    # an op without step or sequence number has no place in the model (the importer never writes one);
    # without one, no filter (it would copy every column to keep every row)
    if ops["step"].null_count() == 0 and ops["seq"].null_count() == 0:
        return ops
    return ops.filter(pl.col("step").is_not_null() & pl.col("seq").is_not_null())


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


def osdi_graph(ops: pl.DataFrame) -> WhatIfGraph:
    steps = np.sort(ops["step"].unique().to_numpy())
    dp = int(ops["dp_rank"].max()) + 1
    pp = int(ops["stage"].max()) + 1
    # the index of each op's step among the sorted steps: a search in ~50 values, not a rank over all ops
    ops = ops.with_columns(pl.Series("step_index", np.searchsorted(steps, ops["step"].to_numpy()), dtype=pl.Int64))
    # The template: one model-parallel group (dp rank 0) in the first step; every (step, dp rank) shares it.
    t = ops.filter((pl.col("dp_rank") == 0) & (pl.col("step") == steps[0])).unique(
        ["optype", "seq", "stage"], keep="first", maintain_order=True).with_row_index("tid")
    t = t.with_columns(pl.col("tid").cast(pl.Int64))
    use_dp = dp > 1
    edges, groups, notes = _osdi_template(t, pp, use_dp)
    ops = ops.join(t.select("optype", "seq", "stage", "tid"), on=["optype", "seq", "stage"], how="left")
    notes["ops_outside_model"] = int(ops["tid"].null_count())
    if notes["ops_outside_model"]:
        ops = ops.filter(pl.col("tid").is_not_null())
    n_inst = len(steps) * dp
    inst = (ops["step_index"] * dp + ops["dp_rank"].cast(pl.Int64)).to_numpy()
    tid = ops["tid"].to_numpy()
    n_t = t.height
    rows = np.full((n_inst, n_t), -1, dtype=np.int64)
    rows[inst, tid] = np.arange(ops.height)
    complete = (rows >= 0).all(axis=1)
    if not complete.all():
        # an incomplete (step, dp rank) would leave dangling dependencies: drop its whole step
        bad_steps = np.unique(np.flatnonzero(~complete) // dp)
        notes["steps_dropped_incomplete"] = [int(steps[i]) for i in bad_steps]
        keep = ~np.isin(ops["step_index"].to_numpy(), bad_steps)
        if not keep.any():
            raise WhatIfInputError("no step has every op of the dependency model on every dp rank")
        ops = ops.filter(pl.Series(keep))
        return osdi_graph(ops.drop("tid", "step_index"))
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    # np.take lays the (instances x edges) result out row-major: ravel is then no second copy
    src = np.take(rows, e[:, 0], axis=1).ravel()
    dst = np.take(rows, e[:, 1], axis=1).ravel()
    group = np.full(ops.height, -1, dtype=np.int64)
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
    stream = (pl.when(pl.col("optype").is_in(list(P2P_TYPES))).then(pl.col("optype"))
              .when(pl.col("optype").is_in(list(DP_COMM_TYPES))).then(pl.lit("dp-comm"))
              .when(pl.col("optype").is_in(list(COMM_TYPES))).then(pl.lit("collective"))
              .otherwise(pl.lit("compute")))
    ops = ops.with_columns(
        pl.Series("synced", synced), pl.col("optype").is_in(list(COMM_TYPES)).alias("comm"),
        stream.alias("stream"), pl.Series("actual", actual))
    notes.update(dp=dp, pp=pp, template_ops=n_t)
    tmpl = Template(rows=rows, src=e[:, 0].copy(), dst=e[:, 1].copy(),
                    groups=tuple((tuple(m), d) for m, d in groups), n_steps=len(steps), dp=dp)
    return WhatIfGraph(ops=ops.drop("tid"), src=src, dst=dst, group=group, step_index=step_idx,
                       steps=steps, model="osdi25", notes=notes, template=tmpl)
