"""The heavy links of a capture: pairs that carry a job's traffic, with storage and control servers peeled off by their shape."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.grid import fit_grid
from rankscope.analysis.fabric.link_models import BALANCED
from rankscope.analysis.fabric.pair_graph import address_key, components, links_without
from rankscope.analysis.fabric.pair_traffic import sampled_bytes_floor


def storage_hubs(edges: pl.DataFrame, min_links: int = 6, ratio: float = 2.0) -> set[str]:
    """Endpoints with at least ``min_links`` heavy links and ``ratio`` times as many as their typical
    neighbour: servers that many clients read from or write to (storage, checkpoints, dataset shards).

    A collective's member has as many links as its peers (two ring links, a few tree links, or
    n-1 all-to-all links for every member alike); a server's clients each have a handful.
    Needs edges a, b.
    """
    if edges.is_empty():
        return set()
    both = pl.concat([edges.select(n="a", m="b"), edges.select(n="b", m="a")])
    deg = both.group_by("n").agg(links=pl.len())
    nb = (both.join(deg.rename({"n": "m", "links": "m_links"}), on="m")
          .group_by("n").agg(nb_links=pl.col("m_links").median()).join(deg, on="n"))
    hub = (pl.col("links") >= min_links) & (pl.col("links") >= ratio * pl.col("nb_links"))
    return set(nb.filter(hub)["n"].to_list())


def peel_servers(edges: pl.DataFrame, config: FlowConfig, max_rounds: int = 3,
                 undecided: list[dict] | None = None) -> set[str]:
    """Servers hidden in a small job's graph: in a connected set of links that forms no valid grid,
    the busiest-linked endpoints whose removal leaves a valid grid (a storage server that a few hosts
    read from closes cycles that no collective or pipeline has).

    At most ``max_rounds`` rounds, each removing the endpoints with the most links, and never more
    than a quarter of the set. When no removal of that kind helps, the endpoints below a gap between
    byte scales (:func:`below_scale_gap`): servers that all of a job's hosts write to, as many as the
    hosts' own peers. Needs edges a, b, bytes, first_ab, first_ba, data_symmetry.

    A connected set whose peel is unfounded (:func:`_peel_unfounded`) is returned whole and, when
    ``undecided`` is given, described there (its endpoints and why), so that the report can say it.
    """
    if edges.is_empty():
        return set()
    nodes = sorted(set(edges["a"].to_list()) | set(edges["b"].to_list()), key=address_key)
    idx = {x: i for i, x in enumerate(nodes)}
    lab = components(nodes, np.array([idx[x] for x in edges["a"].to_list()]),
                     np.array([idx[x] for x in edges["b"].to_list()]))
    servers: set[str] = set()
    sizes = np.bincount(lab)
    copies = np.bincount(sizes)
    for c in np.unique(lab).tolist():
        members = [x for x, k in zip(nodes, lab.tolist()) if k == c]
        # a rail with identical copies carries no server (a server would change its size)
        if len(members) < 4 or copies[sizes[c]] > 1:
            continue
        e = edges.filter(pl.col("a").is_in(members))
        if fit_grid(members, e, config).valid:
            continue
        component = e
        shaped = _peel_storage_shaped(members, e, config)
        if shaped:
            servers.update(_founded_or_whole(shaped, members, component, undecided))
            continue
        one_way = _peel_one_way_servers(members, e, config)
        if one_way:
            servers.update(one_way)
            continue
        removed: list[str] = []
        found = False
        for _ in range(max_rounds):
            both = pl.concat([e.select(n="a"), e.select(n="b")]).group_by("n").agg(links=pl.len())
            top = both.filter(pl.col("links") == pl.col("links").max())["n"].to_list()
            if len(removed) + len(top) > max(len(members) // 4, 1):
                # no busiest endpoint to spare: a server one or two hosts talk to hangs off the end
                top = both.filter(pl.col("links") == 1)["n"].to_list()
                if not top or len(removed) + len(top) > max(len(members) // 2, 1):
                    break
            removed.extend(top)
            e = links_without(e, top)
            rest = sorted(set(e["a"].to_list()) | set(e["b"].to_list()), key=address_key)
            if not e.is_empty() and _pieces_valid(rest, e, config):
                servers.update(_founded_or_whole(set(removed), members, component, undecided))
                found = True
                break
        if not found:
            servers.update(below_scale_gap(members, edges.filter(pl.col("a").is_in(members)), config))
    return servers


def _peel_unfounded(peeled: set[str], edges: pl.DataFrame) -> bool:
    """Both signs of a server are missing from the endpoints peeled off as servers: they have fewer links,
    on average, than the endpoints kept (a server serves many clients, a client uses a few servers), and
    they exchange among themselves a link at least as heavy as any the kept ones do (a job's own
    collective or pipeline link). Then they are as likely the job, and the kept ones its storage: in the
    dev corpus, a 2-host pipeline writing a checkpoint to three servers that replicate to each other both
    ways was peeled as "servers" and the servers' triangle named a 3-stage pipeline at 0.99. Neither
    reading is claimed then: the caller sets the whole connected set apart."""
    a, b = pl.col("a").is_in(list(peeled)), pl.col("b").is_in(list(peeled))
    inner, rest = edges.filter(a & b), edges.filter(~a & ~b)
    if inner.is_empty() or rest.is_empty():
        return False
    links = pl.concat([edges.select(n="a"), edges.select(n="b")]).group_by("n").agg(k=pl.len())
    mean = links.with_columns(peeled=pl.col("n").is_in(list(peeled))).group_by("peeled").agg(pl.col("k").mean())
    k = dict(mean.iter_rows())
    return k.get(True, 0.0) < k.get(False, 0.0) and float(inner["bytes"].max()) >= float(rest["bytes"].max())


def _founded_or_whole(peeled: set[str], members: list[str], edges: pl.DataFrame,
                      undecided: list[dict] | None) -> set[str]:
    if not _peel_unfounded(peeled, edges):
        return peeled
    if undecided is not None:
        undecided.append({"endpoints": len(members), "first": members[0], "either_job": sorted(peeled),
                          "reason": "the endpoints that would be peeled as storage servers have fewer links "
                                    "than the rest and a heavier link among themselves: either set may be "
                                    "the job and the other its storage, so neither is claimed"})
    return set(members)


def below_scale_gap(members: list[str], edges: pl.DataFrame, config: FlowConfig) -> set[str]:
    """Servers a small job's hosts write to, told by byte scale: below a gap of at least ``mode_gap``
    between the byte scales of a connected set's links, the endpoints with no link above the gap,
    when the endpoints with one form valid grids by themselves. Empty when no gap does.

    A training host's own collective and pipeline links carry its bytes; its writes to a storage
    server are light next to them (for the host), however heavy next to the server's other links
    (replication among servers). So the job's hosts are the endpoints with a link on the upper scale
    and the servers have none. A job's pipeline links may be as light as the writes, but they join
    hosts that each have a collective link above the gap: they stay. The lowest gap that works goes
    first (it keeps the most endpoints). A job whose own links are all lighter than its storage's
    replication (a pure pipeline) is beyond this: its hosts would be the ones below the gap, but the
    servers above it receive about as much as they replicate, so :func:`_writes_light` refuses the cut
    and the set is left to the evidence as before (rejected, not mistaken for a job of servers).
    """
    w = np.unique(edges["bytes"].to_numpy().astype(float))[::-1]
    if len(w) < 2:
        return set()
    a, b, by = edges["a"].to_list(), edges["b"].to_list(), edges["bytes"].to_numpy()
    for k in np.flatnonzero(w[:-1] >= config.mode_gap * w[1:])[::-1].tolist():
        upper = {n for x, y, v in zip(a, b, by) if v >= w[k] for n in (x, y)}
        if len(upper) < 2 or len(upper) == len(members):
            continue
        inner = edges.filter(pl.col("a").is_in(list(upper)) & pl.col("b").is_in(list(upper)))
        if _writes_light(upper, edges) and _pieces_valid(sorted(upper), inner, config):
            return set(members) - upper
    return set()


HOST_OWN_TRAFFIC_FACTOR = 10.0
"""a training host moves at least this many times (an order of magnitude) the bytes with its job's peers
that it moves with storage: its collectives and pipeline sends carry the model's gradients and
activations every step, its writes a checkpoint or a log now and then. A storage server moves with its
peers what it replicates of the writes it receives: a small multiple of them (2 (r - 1) for r replicas,
4 for the usual 3)."""


def _writes_light(hosts: set[str], edges: pl.DataFrame) -> bool:
    """Every host's links to endpoints outside ``hosts`` carry, all together, at most
    1/HOST_OWN_TRAFFIC_FACTOR of its bytes to other hosts. Servers that replicate what their clients
    (or a light pipeline's hosts) write to them fail this, so they are never taken for the job and
    their clients for its servers."""
    h = list(hosts)
    both = pl.concat([edges.select(n="a", m="b", w="bytes"), edges.select(n="b", m="a", w="bytes")])
    per = both.filter(pl.col("n").is_in(h)).group_by("n").agg(
        own=pl.col("w").filter(pl.col("m").is_in(h)).sum(), out=pl.col("w").filter(~pl.col("m").is_in(h)).sum())
    return bool((per["out"] * HOST_OWN_TRAFFIC_FACTOR <= per["own"]).all())


STORAGE_ONE_WAY_SHARE = 0.5
"""a storage or checkpoint server moves payload one way, or lopsided, over most of its links (reads out,
writes in, a client that reads more than it writes); a collective's member moves payload both ways in
balance (tree, all-to-all, pairs, pipeline sends) or has exactly one ring link in and one out."""


def storage_shaped(edges: pl.DataFrame, min_links: int = 3) -> pl.DataFrame:
    """Per endpoint: heavy links, how many of them carry payload one way or lopsided (``one_way``: the
    smaller direction under fabric.link_models.BALANCED of the larger), and whether that is a server's shape
    (at least ``min_links`` links, over STORAGE_ONE_WAY_SHARE of them one-way, and not the one-in-one-out
    of a ring member: its only two links, or its two heaviest when they carry HOST_OWN_TRAFFIC_FACTOR times
    all its others, as a ring host that also reads and writes storage does). Every collective's and
    pipeline's link is one-way (a ring's, with its ACKs) or
    balanced (activations and their gradients, a tree's reduce and broadcast): a link whose directions
    carry 5-50 % of each other is a client's reads and writes. Needs edges a, b, data_ab, data_ba (or
    bytes_ab, bytes_ba)."""
    ab, ba = ("data_ab", "data_ba") if "data_ab" in edges.columns else ("bytes_ab", "bytes_ba")
    sym = (pl.min_horizontal(ab, ba) / pl.max_horizontal(ab, ba)).fill_nan(0.0).fill_null(0.0)
    e = edges.with_columns(one_way=sym < BALANCED, a_sends=pl.col(ab) >= pl.col(ba),
                           w=(pl.col(ab) + pl.col(ba)).cast(pl.Float64))
    both = pl.concat([
        e.select(n="a", one_way="one_way", out=pl.col("one_way") & pl.col("a_sends"), w="w"),
        e.select(n="b", one_way="one_way", out=pl.col("one_way") & ~pl.col("a_sends"), w="w")])
    # heaviest first: group_by keeps the rows' order within each group
    per = both.sort("w", descending=True).group_by("n").agg(
        links=pl.len(), one_way=pl.col("one_way").sum(), out=pl.col("out").sum(),
        # its two heaviest links, one-way, one out and one in, carrying an order of magnitude more than
        # all its others: a ring member that also reads and writes storage, not a server
        top_in_out=pl.col("one_way").head(2).all() & (pl.col("out").head(2).sum() == 1),
        second=pl.col("w").slice(1, 1).first(), rest=pl.col("w").slice(2).sum())
    ring_like = ((pl.col("links") == 2) & (pl.col("out") == 1)) | (
        pl.col("top_in_out") & (pl.col("second") >= HOST_OWN_TRAFFIC_FACTOR * pl.col("rest")).fill_null(False))
    return per.with_columns(server=(pl.col("links") >= min_links) & ~ring_like
                            & (pl.col("one_way") > STORAGE_ONE_WAY_SHARE * pl.col("links"))).drop(
        "top_in_out", "second", "rest")


def _peel_storage_shaped(members: list[str], edges: pl.DataFrame, config: FlowConfig,
                         max_rounds: int = 8) -> set[str]:
    """Remove servers shaped like storage (see :func:`storage_shaped`) until the rest splits into valid
    grids; at most half the endpoints. Small jobs whose every host writes to several storage servers
    have server links as heavy as their own and as many servers as hosts. The most-linked go first; a
    host that writes to many servers may have as many links as a server, so failing that, the ones with
    most one-way links (a server's are its many clients, a client's the few servers it writes to)."""
    for key in ("links", "one_way"):
        removed: list[str] = []
        e = edges
        for _ in range(max_rounds):
            shape = storage_shaped(e).filter(pl.col("server"))
            if shape.is_empty():
                break
            top = shape.filter(pl.col(key) == pl.col(key).max())["n"].to_list()
            if len(removed) + len(top) > len(members) // 2:
                break
            removed.extend(top)
            e = links_without(e, top)
            if e.is_empty():
                break
            rest = sorted(set(e["a"].to_list()) | set(e["b"].to_list()))
            if _pieces_valid(rest, e, config):
                return set(removed)
    return set()


def _peel_one_way_servers(members: list[str], edges: pl.DataFrame, config: FlowConfig) -> set[str]:
    """The storage-shaped endpoints (:func:`storage_shaped`) that have no balanced link, all at once, when
    the rest then forms valid grids (directly, or after a shaped peel of the rest) and the whole peel is
    founded (:func:`_peel_unfounded`). A training host has
    a balanced link (a pipeline's activations and gradients, a tree's reduce and broadcast, a pair) or is
    a ring member (one in, one out: never storage-shaped); a server's links are one-way or lopsided, its
    clients' reads and writes and its chain replication. Small jobs writing to more servers than they have
    hosts need this: the most-linked-first peel stops at half the set (dev corpus: a 2-host pipeline and
    its six servers, whose hosts, writing to three servers each, looked like servers too)."""
    # every link one-way or lopsided: no balanced one
    cand = set(storage_shaped(edges).filter(pl.col("server") & (pl.col("one_way") == pl.col("links")))["n"]
               .to_list())
    if not cand or len(cand) >= len(members) - 1:
        return set()
    rest = links_without(edges, cand)
    if rest.is_empty():
        return set()
    nodes = sorted(set(rest["a"].to_list()) | set(rest["b"].to_list()))
    if not _pieces_valid(nodes, rest, config):
        # a server that also trades balanced payload with one client stays; among the rest, its other
        # links are one-way again and it has the storage shape
        more = _peel_storage_shaped(nodes, rest, config)
        if not more:
            return set()
        cand |= more
    return set() if _peel_unfounded(cand, edges) else cand


def _pieces_valid(nodes: list[str], edges: pl.DataFrame, config: FlowConfig) -> bool:
    """Every connected piece left forms a valid grid (removing a server may split rails apart)."""
    idx = {x: i for i, x in enumerate(nodes)}
    lab = components(nodes, np.array([idx[x] for x in edges["a"].to_list()]),
                     np.array([idx[x] for x in edges["b"].to_list()]))
    for c in np.unique(lab).tolist():
        m = [x for x, k in zip(nodes, lab.tolist()) if k == c]
        if len(m) >= 2 and not fit_grid(m, edges.filter(pl.col("a").is_in(m)), config).valid:
            return False
    return True


def light_pendants(edges: pl.DataFrame, mode_gap: float) -> set[str]:
    """Endpoints hanging off a job by one link much lighter than their neighbour's busiest link: a
    storage server or a control host that one member talks to. A pipeline's end stage hangs off by
    a link as heavy as the pipeline's other links, and a tree's leaf by one as heavy as the tree's.
    Needs edges a, b, bytes.
    """
    if edges.is_empty():
        return set()
    both = pl.concat([edges.select(n="a", m="b", w="bytes"), edges.select(n="b", m="a", w="bytes")])
    per = both.group_by("n").agg(links=pl.len(), wmax=pl.col("w").max())
    pend = both.join(per.filter(pl.col("links") == 1).select("n"), on="n").join(
        per.rename({"n": "m", "links": "m_links", "wmax": "m_wmax"}), on="m")
    # the neighbour must have other links: two endpoints joined by one link are a pair, not a pendant
    light = pend.filter((pl.col("m_links") > 1) & (pl.col("w") * mode_gap < pl.col("m_wmax")))
    return set(light["n"].to_list())


def heavy_edges(edges: pl.DataFrame, config: FlowConfig | None = None,
                undecided: list[dict] | None = None) -> pl.DataFrame:
    """Edges carrying at least ``edge_min_fraction`` of the busiest edge of either endpoint, less the
    links of storage/checkpoint servers (see :func:`rankscope.analysis.fabric.heavy_links.storage_hubs`).

    Payload bytes are weighed where the edges have them (data_ab, data_ba): a connection that only
    ever carried its set-up and ACKs is no link of the job. Sampling scales such packets up with the
    rest: in a real 4-stage gloo pipeline under 1-in-16 sFlow, the set-up of a pair of non-neighbour
    stages (gloo connects every pair) read as 3 KB against 1 MB links, 0.3 % of the busiest, and
    closed a cycle that no pipeline has; the middle stage was then peeled off as a server and the
    job read as a 2-stage pipeline at 0.98.

    Connected sets that could be a job or its storage either way are dropped whole and, when
    ``undecided`` is given, described there.
    """
    cfg = config or FlowConfig()
    if edges.is_empty():
        return edges
    w = (pl.col("data_ab") + pl.col("data_ba")) if {"data_ab", "data_ba"} <= set(edges.columns) else pl.col("bytes")
    if "data_samples" in edges.columns:
        # a sampled link weighs what its samples show for sure: one sample scaled by 1 in 1,000 reads
        # as 4 MB whatever the link carried, and a storage server that sent one packet to each of five
        # hosts of a 2,048-GPU job had joined it (its grid then fit no job)
        w = w * sampled_bytes_floor(pl.col("data_samples"))
    e = edges.with_columns(_w=w)
    node_max = pl.concat([e.select(n="a", w="_w"), e.select(n="b", w="_w")]).group_by("n").agg(
        wmax=pl.col("w").max())
    e = (e.join(node_max.rename({"n": "a", "wmax": "wa"}), on="a")
         .join(node_max.rename({"n": "b", "wmax": "wb"}), on="b"))
    heavy = e.filter((pl.col("_w") > 0) & (pl.col("_w") >= cfg.edge_min_fraction * pl.max_horizontal("wa", "wb"))
                     ).drop("wa", "wb", "_w")
    # storage / checkpoint servers are told by the shape of their links, on whatever port they use

    # servers first: a pendant is judged against its neighbour's busiest *job* link, and a rail whose host
    # also reads from a server more than it trades with its peer is no pendant of that server (dev corpus
    # seed 6: one rail of a 2-stage pipeline on eight rails was dropped so, and the job found one rail short)
    heavy = links_without(heavy, storage_hubs(heavy))
    heavy = links_without(heavy, light_pendants(heavy, cfg.mode_gap))
    return links_without(heavy, peel_servers(heavy, cfg, undecided=undecided))
