"""Parallel strategy and step times of one job from switch flow records alone (black-box).

Pipeline: per-pair traffic (fabric.pair_traffic) -> heavy pairs -> the job's
endpoints -> DP/PP grid fit (fabric.grid) -> stage order -> tensor-parallel
degree from the endpoints that the grid leaves over -> step boundaries from
the period of DP bursts. Endpoints are address strings.
"""

from __future__ import annotations

from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.fabric.clock import flow_clock
from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.grid import GridFit, fit_grid
from rankscope.analysis.fabric.heavy_links import heavy_edges
from rankscope.analysis.fabric.pair_graph import address_key, components
from rankscope.analysis.fabric.pair_traffic import PairTraffic, pair_traffic, undirected_edges
from rankscope.analysis.fabric.rails import merge_components
from rankscope.analysis.fabric.tie_evidence import wrap_by_bytes
from rankscope.analysis.report.steps import Steps
from rankscope.analysis.report.strategy import FlowsDetail, Labelling, Strategy, Undecided
from rankscope.analysis.strategy.flows import notes
from rankscope.analysis.strategy.flows.confidence import (
    evidence_class,
    grid_confidence,
    stage_order_confidence,
)
from rankscope.analysis.strategy.flows.link_dating import connection_dated, ends_dated
from rankscope.analysis.strategy.flows.ranks_per_address import (
    RanksPerAddress,
    degrees_with_hidden_ranks,
    ranks_per_address,
)
from rankscope.analysis.strategy.flows.sample_counts import all_links_seen_chance, sampled_packets
from rankscope.analysis.strategy.flows.stage_order import dp_end_votes, order_pipelines
from rankscope.analysis.strategy.flows.steps import flow_steps
from rankscope.collectors.record_class import record


@record(frozen=False)
class FlowInference:
    strategy: Strategy
    steps: Steps
    quality: dict = field(default_factory=dict)
    job_flows: pl.DataFrame | None = None
    """the job's training records (aligned, with est_bytes and is_data), for flow-based stragglers."""
    dp_pairs: frozenset = frozenset()
    """the heavy address pairs (a, b), a < b, that the strategy labels data-parallel: the collectives'
    own links, not every pair of one DP group (connection meshes, setup flows)."""


def _tp_groups(nodes: list[str], rail_of: dict[str, int], pipelines: list[list[str]], tp: int,
               endpoint_map: pl.DataFrame | None) -> list[list[str]] | None:
    """TP peers never reach the switch; they sit in the same stage on one host.

    With an endpoint_map: same stage and host. Without: one member per rail
    (disconnected copy of the job's graph) per stage, the i-th address of each
    rail together (assumes hosts number their NICs in the same order on every rail).
    """
    if tp <= 1:
        return [[x] for x in nodes]
    stage = {x: i for p in pipelines for i, x in enumerate(p)}
    host = {}
    if endpoint_map is not None and not endpoint_map.is_empty():
        host = dict(zip(endpoint_map["address"].to_list(), endpoint_map["host"].to_list()))
    groups = []
    if host and all(x in host for x in nodes):
        by: dict = {}
        for x in nodes:
            by.setdefault((stage.get(x, 0), host[x]), []).append(x)
        for members in by.values():
            members = sorted(members, key=address_key)
            groups.extend(members[i:i + tp] for i in range(0, len(members), tp))
    else:
        by = {}
        for x in sorted(nodes, key=address_key):
            by.setdefault((stage.get(x, 0), rail_of.get(x, 0)), []).append(x)
        stages = sorted({k[0] for k in by})
        for s in stages:
            rails = [by[k] for k in sorted(by) if k[0] == s]
            if len({len(r) for r in rails}) == 1 and len(rails) == tp:
                groups.extend([list(g) for g in zip(*rails)])
            else:
                members = sorted((x for r in rails for x in r), key=address_key)
                groups.extend(members[i:i + tp] for i in range(0, len(members), tp))
    return sorted((sorted(g, key=address_key) for g in groups), key=lambda g: address_key(g[0]))


def _wrap_unknown(pipes: list[list[str]], pp_edges: pl.DataFrame) -> bool:
    """Whether the pipelines close into cycles (an interleaved schedule's last stage sends back to its
    first) and some cycle's wrap is not the link that its bytes show short both ways (fabric.tie_evidence):
    with no stage-order vote, where such a cycle was cut is a guess."""
    links = {frozenset(x) for x in pp_edges.select("a", "b").iter_rows()}
    cycles = [p for p in pipes if len(p) > 2 and frozenset((p[0], p[-1])) in links]
    if not cycles:
        return False
    sent = {}
    if {"bytes_ab", "bytes_ba"} <= set(pp_edges.columns):
        for a, b, x, y in pp_edges.select("a", "b", "bytes_ab", "bytes_ba").iter_rows():
            sent[(a, b)], sent[(b, a)] = x, y
    return any(wrap_by_bytes(p, sent) != len(p) - 1 for p in cycles)


def infer_flows(flow: pl.DataFrame, config: FlowConfig | None = None,
                endpoint_map: pl.DataFrame | None = None, one_job: bool = False) -> FlowInference:
    """Strategy and steps of one job from its flow records (exporter clocks already aligned).

    Needs flow columns src_addr, dst_addr, src_port, dst_port, exporter,
    size_bytes, sampling_rate, start_ns, end_ns. If the records hold more than
    one job, the biggest connected one is analysed and the rest counted.
    ``one_job``: the records are those of one job that job recognition found
    on the whole capture (``fabric.recognise.job_flows``), so all their endpoints are
    that job: its rails are not merged again from these records alone, which
    lack what joined them there (the rendezvous server may sit outside the job).
    """
    cfg = config or FlowConfig()
    pt = pair_traffic(flow, cfg)
    quality = dict(pt.quality)
    if pt.pairs.is_empty():
        return FlowInference(Strategy(method="flows", evaluated=False, why=notes.no_training_flows()),
                             Steps(evaluated=False, why=notes.no_training_flows()), quality)
    edges = undirected_edges(pt.pairs)
    tick, batching = flow_clock(pt.training_flows)
    resolution = max(tick, batching)
    heavy, nodes, rail_of, outside = _main_job(edges, pt, cfg, one_job, resolution)
    if outside:
        quality["endpoints_outside_main_job"] = outside
    quality["pairs"] = int(edges.height)
    quality["heavy_pairs"] = int(heavy.height)
    quality["timestamp_resolution_ns"] = resolution
    # the job's records between its own endpoints: link dating, DP end votes and the caller read them
    inside = pt.training_flows.filter(pl.col("src_addr").is_in(nodes) & pl.col("dst_addr").is_in(nodes))
    links = list(heavy.select("a", "b").iter_rows())
    heavy, undated, end_dated = _date_links(inside, heavy, links, resolution)
    fit = fit_grid(nodes, heavy, cfg, resolution)
    # an all-to-all mesh's own links are neither DP nor PP: they burst every microbatch, not once per step
    mesh = fit.mesh_only if fit.mesh_only is not None else np.zeros(len(links), dtype=bool)
    dp_pairs = {(a, b) for (a, b), pp_edge, m in zip(links, fit.is_pp, mesh) if not pp_edge and not m}
    stage_votes = _stage_votes(inside, fit, dp_pairs, resolution)
    pipes, order_share = order_pipelines(fit, heavy, resolution, stage_votes, cfg.max_exporter_skew_ns,
                                         undated)
    dp = len(fit.dp_groups[0]) if fit.dp_groups else 1
    pp = len(pipes[0]) if pipes else 1
    # several ranks may share an address: count them from the connections of the heavy pairs
    job_flows = pt.training_flows.filter(pl.col("src_addr").is_in(nodes))
    rpa = ranks_per_address(job_flows, links)
    world, tp, rpa_note = degrees_with_hidden_ranks(len(nodes), dp, pp, rpa)
    job_notes = list(fit.notes) + [rpa_note] + _link_timing_notes(
        resolution, batching, pp, _pipeline_links_among(links, fit, undated),
        _pipeline_links_among(links, fit, end_dated))
    # TP groups between addresses: the part of tp that the addresses show (ranks sharing an
    # address are one group member here, since endpoints are addresses)
    tp_addr = tp // rpa.ranks if tp and rpa.ranks else (tp or 1)
    tp_groups = _tp_groups(nodes, rail_of, pipes, tp_addr, endpoint_map)
    conf, evidence, sampled = _confidence(fit, pp, order_share, heavy)
    if sampled:
        job_notes.append(sampled)
    wrap_unknown = order_share == 0 and _wrap_unknown(pipes, heavy.filter(pl.Series(fit.is_pp)))
    job_notes += _order_notes(fit, pp, order_share, wrap_unknown)
    steps = flow_steps(job_flows, dp_pairs)
    detail = _detail(fit, pp, order_share, wrap_unknown, evidence, stage_votes, rpa)
    strat = Strategy(world_size=world, dp=dp, pp=pp, tp=tp, dp_groups=fit.dp_groups, pp_groups=pipes,
                     confidence=float(round(conf, 4)), ep=len(fit.ep_groups[0]) if fit.ep_groups else None,
                     ep_groups=fit.ep_groups or None, cp=None, tp_groups=tp_groups, method="flows",
                     notes=job_notes + notes.expert_parallel(fit.ep_groups, fit.expert_dp_groups), flows=detail,
                     undecided=_undecided(fit, dp, pp, tp, order_share))
    return FlowInference(strat, steps, quality, inside, frozenset(dp_pairs))


def _main_job(edges: pl.DataFrame, pt: PairTraffic, cfg: FlowConfig, one_job: bool,
              resolution_ns: int) -> tuple[pl.DataFrame, list[str], dict[str, int], int]:
    """The biggest job among the records' heavy links: (its heavy edges, its endpoints in address order,
    each endpoint's rail (the connected component of heavy links it sits in), how many endpoints of
    heavy links lie outside it). ``edges``: fabric.pair_traffic.undirected_edges of ``pt``'s pairs;
    ``one_job``: all endpoints are one job already (see infer_flows), so rails are not merged;
    ``resolution_ns``: how finely the training flows' times order anything (flow_clock)."""
    heavy = heavy_edges(edges, cfg)
    nodes_all = sorted(set(heavy["a"].to_list()) | set(heavy["b"].to_list()), key=address_key)
    idx = {x: i for i, x in enumerate(nodes_all)}
    rails = components(nodes_all, np.array([idx[x] for x in heavy["a"].to_list()]),
                       np.array([idx[x] for x in heavy["b"].to_list()]))
    lab = np.zeros(len(nodes_all), dtype=np.int64) if one_job else \
        merge_components(nodes_all, rails, pt.training_flows, pt.control_flows, cfg, resolution_ns)
    big = int(np.argmax(np.bincount(lab)))
    nodes = [x for x, c in zip(nodes_all, lab) if c == big]
    rail_of = {x: int(r) for x, r, c in zip(nodes_all, rails, lab) if c == big}
    return heavy.filter(pl.col("a").is_in(nodes)), nodes, rail_of, len(nodes_all) - len(nodes)


def _date_links(inside: pl.DataFrame, heavy: pl.DataFrame, links: list[tuple[str, str]],
                resolution_ns: int) -> tuple[pl.DataFrame, set[frozenset], set[frozenset]]:
    """Which link times date the traffic: (``heavy`` with ``last_link`` nulled where a link's last
    record ends at its connection's teardown, the links whose records date their TCP connections rather
    than their traffic (strategy.flows.link_dating.connection_dated), those of them whose last payload
    still dates their last gradients (ends_dated)). ``inside``: the job's records between its endpoints;
    ``links``: ``heavy``'s (a, b) in row order."""
    # TCP links whose records span the steps end with their teardown: that end is no time of the traffic
    undated = connection_dated(inside, links, resolution_ns)
    # (their last data still dates them where the flags show the teardown in a record of its own)
    end_dated = ends_dated(inside, undated)
    end_undated = undated - end_dated
    if end_undated and "last_link" in heavy.columns:
        heavy = heavy.with_columns(last_link=pl.when(pl.Series([frozenset(x) in end_undated for x in links]))
                                   .then(None).otherwise(pl.col("last_link")))
    return heavy, undated, end_dated


def _stage_votes(inside: pl.DataFrame, fit: GridFit, dp_pairs: set[tuple[str, str]],
                 resolution_ns: int) -> dict[tuple[int, int], tuple[int, int]]:
    """The stage-order votes of the DP groups' gradient reductions (strategy.flows.stage_order.dp_end_votes);
    none unless the grid is valid and has pipelines, the only case where stages have an order."""
    if not (fit.valid and fit.pipelines and len(fit.pipelines[0]) > 1):
        return {}
    return dp_end_votes(inside, fit.dp_groups, fit.pipelines, dp_pairs, resolution_ns)


def _pipeline_links_among(links: list[tuple[str, str]], fit: GridFit, among: set[frozenset]) -> int:
    """How many of the fit's pipeline links (``links`` in the order of ``fit.is_pp``) are in ``among``."""
    return sum(1 for x, pp_edge in zip(links, fit.is_pp) if pp_edge and frozenset(x) in among)


def _link_timing_notes(resolution_ns: int, batching: int, pp: int, pp_undated: int,
                       pp_end_dated: int) -> list[str]:
    """The notes on what the records' times can say: samples timed by datagrams (``batching``, at a
    resolution of a millisecond or more), and pipeline links whose records date their TCP connections
    (``pp_undated``) or still their last gradients (``pp_end_dated``)."""
    out = []
    if resolution_ns >= 1_000_000 and batching:
        out.append(notes.datagram_timing(resolution_ns))
    if pp_undated and pp > 1:
        out.append(notes.pipeline_links_undated(pp_undated))
    if pp_end_dated and pp > 1:
        out.append(notes.pipeline_links_end_dated(pp_end_dated))
    return out


def _confidence(fit: GridFit, pp: int, order_share: float,
                heavy: pl.DataFrame) -> tuple[float, str, str | None]:
    """(the chance the report is right, what it rests on (strategy.flows.confidence.evidence_class), the
    sampled-capture note or None): from the grid's evidence, how clearly the stage order was voted, and,
    for a sampled capture, the chance that none of the job's links went unseen."""
    # confidence from the evidence: how well the links fit their models, how clearly the stage
    # order was voted, and whether another labelling explains the traffic as well
    conf = grid_confidence(fit.valid, len(fit.alternatives), pp, order_share, fit.tie_kind)
    evidence = evidence_class(fit.valid, len(fit.alternatives), pp, order_share, fit.tie_kind)
    # a sampled capture's light links may have gone unseen, and with them a stage or a member
    counts = sampled_packets(heavy)
    seen_all = all_links_seen_chance(counts)
    if seen_all >= 0.99:
        return conf, evidence, None
    if seen_all < 0.9:
        evidence = "few samples: links may be unseen"
    return conf * seen_all, evidence, notes.sampled_capture(len(counts), min(counts.values()), seen_all)


def _order_notes(fit: GridFit, pp: int, order_share: float, wrap_unknown: bool) -> list[str]:
    """The notes on what the report does not claim: the pipelines' direction when no link voted on it
    (a vote makes the share at least one half), where their cycles wrap, and which of equally fitting
    labellings is right."""
    out = []
    if pp > 1 and order_share == 0:
        out.append(notes.stage_order_unknown())
        if wrap_unknown:
            out.append(notes.wrap_unknown())
    if fit.alternatives and not fit.tie_broken:
        out.append(notes.equal_labellings(len(fit.alternatives) + 1))
    return out


def _undecided(fit: GridFit, dp: int, pp: int, tp: int | None, order_share: float) -> list[Undecided]:
    """What the flows leave open: the groups of a standing tie (and the degrees, when its labellings
    differ in them), the pipelines' direction without a vote, tp when the addresses do not show it."""
    out = []
    if fit.alternatives and not fit.tie_broken:
        why = notes.undecided_tie(len(fit.alternatives) + 1)
        labellings = [{"dp": dp, "pp": pp, "dp_groups": fit.dp_groups[:4]}, *fit.alternatives]
        for degree in ("dp", "pp"):
            values = sorted({lab[degree] for lab in labellings})
            if len(values) > 1:
                out.append(Undecided(degree, why, values))
        out.append(Undecided("dp_groups", why, [lab["dp_groups"] for lab in labellings]))
    if pp > 1 and order_share == 0:
        out.append(Undecided("stage_order", notes.undecided_stage_order(), ["as listed", "reversed"]))
    if tp is None:
        out.append(Undecided("tp", notes.undecided_tp()))
    if fit.ep_undecided:
        out.append(Undecided("ep", fit.ep_undecided, [None, max(len(g) for g in fit.dp_groups)]))
    return out


def _detail(fit: GridFit, pp: int, order_share: float, wrap_unknown: bool, evidence: str,
            stage_votes: dict[tuple[int, int], tuple[int, int]], rpa: RanksPerAddress) -> FlowsDetail:
    """The report's flows section: the evidence behind the strategy (grid, votes, ties, ranks per address)."""
    return FlowsDetail(
        grid_valid=fit.valid, stage_order_agreement=round(order_share, 4), model_fit=round(fit.fit, 4),
        dp_group_kinds=fit.group_kinds, ambiguous=fit.ambiguous,
        alternatives=[Labelling(**a) for a in fit.alternatives], tie_broken=fit.tie_broken,
        tie_evidence=fit.tie_evidence or None, stage_order_known=bool(pp == 1 or order_share > 0),
        wrap_unknown=wrap_unknown, stage_order_confidence=stage_order_confidence(pp, order_share),
        confidence_evidence=evidence,
        stage_order_dp_votes={f"{i}>{j}": list(v) for (i, j), v in stage_votes.items() if i < j},
        ranks_per_address=rpa.as_dict())
