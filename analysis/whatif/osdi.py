"""The OSDI'25 op-level what-if model: records with OSDI op types (the whatif_parquet importer).

One model-parallel group's ops in one step form a template of edges and sync
groups (:func:`_osdi_template`); every (step, dp rank) instance shares it. See
:mod:`rankscope.analysis.whatif.graph` for the graph and its replay semantics.
"""

from __future__ import annotations

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
    # an op without step or sequence number has no place in the model (the importer never writes one)
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


def _osdi_template(t: pl.DataFrame, pp: int, use_dp: bool) -> tuple[list, list, dict]:
    """Edges and sync groups among the ops of one model-parallel group in one step.

    ``t``: rows with tid, optype, seq, stage, start_ns, end_ns. Returns
    (edges [(u, v)], groups [(members, dp_sync)], notes) in template ids.
    """
    key = {(o, s, st): i for i, o, s, st in zip(t["tid"], t["optype"], t["seq"], t["stage"], strict=True)}
    edges: list = []
    groups: list = []
    notes = {"unpaired_p2p": 0}
    ovlp = "separate-grads-all-reduce" in set(t["optype"].to_list())
    pair_members: dict = {}
    stages = _stage_rows(t)
    for s in range(pp):
        ts = stages.get(s, [])
        # (start_ns, seq, optype) is unique within a stage, so this order is the only one
        ordered = sorted(ts, key=lambda r: (_null_first(r[3]), _null_first(r[2]), r[1]))
        by_seq = _by(ts, 2)
        comp = [r for r in ordered if r[1] in (FWD, BWD)]
        comp_ids = [r[0] for r in comp]
        _chain(edges, comp_ids)
        p2p = [r for r in ordered if r[1] in P2P_TYPES]
        for direction, delta_send in (("forward", 1), ("backward", -1)):
            ct = [r for r in comp if r[1] == f"{direction}-compute"]
            if not ct:
                continue
            last_start = max((r[3] for r in ct if r[3] is not None), default=None)
            first_end = min((r[4] for r in ct if r[4] is not None), default=None)
            for sr in ("send", "recv"):
                optype = f"{direction}-{sr}"
                ops = [r for r in p2p if r[1] == optype]
                if not ops:
                    continue
                if sr == "recv":
                    valid = [r[3] is not None and last_start is not None and r[3] <= last_start + _EPS_MATCH_NS
                             for r in ops]
                else:
                    valid = [r[4] is not None and first_end is not None and r[4] >= first_end - _EPS_MATCH_NS
                             for r in ops]
                cid = 1 if (sr == "recv" and sum(valid) + 1 == len(ct)) else 0
                peer_stage = s + (delta_send if sr == "send" else -delta_send)
                noop_peer = peer_stage < 0 or peer_stage >= pp
                peer_type = f"{direction}-{'recv' if sr == 'send' else 'send'}"
                k = 0
                for op_id, ok in zip([r[0] for r in ops], valid, strict=True):
                    match = key.get((f"{direction}-compute", cid, s)) if ok else None
                    if match is not None:
                        if sr == "send":
                            edges.append((match, op_id))
                        else:
                            edges.append((op_id, match))
                            prev = key.get((f"{direction}-compute", cid - 1, s))
                            if prev is not None:
                                edges.append((prev, op_id))
                        cid += 1
                    if not ok or noop_peer:
                        groups.append(([op_id], False))
                        continue
                    pair = tuple(sorted([(optype, k, s), (peer_type, k, peer_stage)]))
                    pair_members.setdefault(pair, []).append(op_id)
                    k += 1
        for optype in P2P_TYPES:
            _chain(edges, _ids(p2p, optype))
        first_bwd = next((i for i, r in enumerate(comp) if r[1] == BWD), None)
        if first_bwd is not None and first_bwd >= 2:
            for optype in ("backward-recv", "backward-send"):
                op = key.get((optype, 0, s))
                if op is not None:
                    edges.append((comp_ids[first_bwd - 2], op))
        rs = _ids(by_seq, "grads-reduce-scatter")
        if use_dp:
            _chain(edges, _ids(ordered, "params-all-gather", "grads-reduce-scatter"))
            ag = _ids(by_seq, "params-all-gather")
            fwd = [r for r in comp if r[1] == FWD]
            if ag and fwd:
                edges.append((ag[-1], _by(fwd, 3)[0][0]))
            if ovlp and rs:
                edges.append((_by([r for r in comp if r[1] == BWD], 4)[-1][0], rs[0]))
        tail = [key.get(("layernorm-grads-all-reduce", 0, s))]
        if s in (0, pp - 1):
            tail.append(key.get(("embedding-grads-all-reduce", 0, s)))
        if use_dp and ovlp:
            tail.append(key.get(("separate-grads-all-reduce", 0, s)))
        elif use_dp:
            tail.extend(rs)
        tail += [key.get(("optimizer-clip-main-grad", 0, s)), key.get(("optimizer", 0, s))]
        tail = [x for x in tail if x is not None]
        gc = key.get(("gc", 0, s))
        if comp:
            last = _by(comp, 4)[-1][0]
            head = gc if gc is not None else (tail[0] if tail else None)
            if head is not None:
                edges.append((last, head))
        chain = ([gc] if gc is not None else []) + tail
        _chain(edges, chain)
        if use_dp and ovlp and rs and tail:
            edges.append((rs[-1], tail[0]))
        if use_dp:
            for i in _ids(ts, *DP_COMM_TYPES):
                groups.append(([i], True))
    for members in pair_members.values():
        if len(members) == 2:
            groups.append((members, False))
        else:
            notes["unpaired_p2p"] += len(members)
            groups.extend(([m], False) for m in members)
    emb = [key.get(("embedding-grads-all-reduce", 0, s)) for s in sorted({0, pp - 1})]
    emb = [x for x in emb if x is not None]
    if emb:
        groups.append((emb, False))
    clip = [key.get(("optimizer-clip-main-grad", 0, s)) for s in range(pp)]
    clip = [x for x in clip if x is not None]
    if clip:
        groups.append((clip, True))
    return edges, groups, notes


def osdi_graph(ops: pl.DataFrame) -> WhatIfGraph:
    steps = np.sort(ops["step"].unique().to_numpy())
    dp = int(ops["dp_rank"].max()) + 1
    pp = int(ops["stage"].max()) + 1
    ops = ops.with_columns(pl.col("step").rank("dense").cast(pl.Int64).sub(1).alias("step_index"))
    # The template: one model-parallel group (dp rank 0) in the first step; every (step, dp rank) shares it.
    t = ops.filter((pl.col("dp_rank") == 0) & (pl.col("step") == steps[0])).unique(
        ["optype", "seq", "stage"], keep="first", maintain_order=True).with_row_index("tid")
    t = t.with_columns(pl.col("tid").cast(pl.Int64))
    use_dp = dp > 1
    edges, groups, notes = _osdi_template(t, pp, use_dp)
    ops = ops.join(t.select("optype", "seq", "stage", "tid"), on=["optype", "seq", "stage"], how="left")
    notes["ops_outside_model"] = int(ops["tid"].null_count())
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
    src = rows[:, e[:, 0]].ravel()
    dst = rows[:, e[:, 1]].ravel()
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
