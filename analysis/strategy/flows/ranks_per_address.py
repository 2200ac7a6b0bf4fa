"""How many rank endpoints share one address, from the connections between addresses.

Flow records name addresses, not ranks. When several ranks of a job share an
address (a host with one NIC for several GPUs, or several processes per
container), ``endpoints / (dp * pp)`` under-counts the tensor-parallel degree:
ranks that share an address talk to each other inside the host and never show
on the wire. What does show is how many *connections* two addresses keep:

- TCP (gloo, NCCL's socket transport): each communicating rank pair keeps its
  own connection, so the ranks at address A that exchange data with ranks at
  address B do it over distinct port pairs. In a data-parallel x pipeline grid
  every rank at A has exactly one peer at each neighbouring address (the rank
  with the same position inside the host), so each heavy address pair carries
  ``k`` data connections of about equal size, ``k`` = ranks per address.
  Each of the ``k`` connections ends in its own process at both ends, so the
  two sides show ``k`` distinct ports each; several sockets of one rank pair
  share the listening port at one end and so are not counted as ranks.
- RoCEv2: each connection is a queue pair at each end, so the distinct
  ``dst_qp`` per direction (sFlow raw headers) count connections, and so do the
  UDP source ports (RoCEv2 gives each queue pair its own source port for ECMP
  entropy; IPFIX keeps those). A rank pair may use several queue pairs
  (channels, NCCL_IB_QPS_PER_CONNECTION), so a count ``k`` above one is a
  hidden factor (ranks x queue pairs per rank pair), not ranks; one queue pair
  per direction is one rank pair. The ranks that share a NIC address divide a
  host's GPUs, a power of two on GPU servers (1, 2, 4, 8), so only the
  power-of-two part of ``k`` can be ranks: an odd ``k`` is one rank per
  address, an even one stays undecided (the candidates are listed).
  A count is trusted only when every connection would show up under the
  exporter's sampling (``min_sampled_packets`` kept packets per connection).

Connection set-up, barriers and store traffic on other connections carry
orders of magnitude less than the data connections and are left out by a
clear gap in bytes. When the pairs disagree, or the split is not clear, the
answer is ``None`` with the reason: never a guessed 1.
"""

from __future__ import annotations

from dataclasses import field

import polars as pl

from rankscope.analysis.fabric.pair_traffic import connection_columns, on_pairs
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record

ROCE_PORT = 4791


@record
class RanksPerAddressConfig:
    equal_share_ratio: float = 3.0
    """data connections of one address pair carry bytes within this factor of the largest one
    (co-located ranks do the same work; headers, ACKs and timing move a few percent)."""
    setup_gap_ratio: float = 10.0
    """every other connection of the pair must carry at most 1/this of the smallest data
    connection (set-up, barriers); anything in between makes the count undecided."""
    min_sampled_packets: int = 30
    """a pair's count of RoCE queue pairs is trusted only when its exported (kept) packets average
    at least this many per queue pair seen: then a queue pair of the same share that sampling
    missed entirely would be a chance under e**-30."""

    def __post_init__(self):
        if not self.equal_share_ratio > 1:
            raise ConfigError(f"RanksPerAddressConfig.equal_share_ratio must be > 1, got {self.equal_share_ratio}")
        if not self.setup_gap_ratio > 1:
            raise ConfigError(f"RanksPerAddressConfig.setup_gap_ratio must be > 1, got {self.setup_gap_ratio}")
        if self.min_sampled_packets < 1:
            raise ConfigError(f"RanksPerAddressConfig.min_sampled_packets must be >= 1, got {self.min_sampled_packets}")


@record
class RanksPerAddress:
    ranks: int | None
    """rank endpoints per address; None when the flows cannot tell."""
    hidden_factor: int | None
    """connections per heavy address pair (ranks x connections per rank pair); None when undecided."""
    basis: str
    """tcp_connections, roce_dst_qp, roce_source_ports or none."""
    why: str
    pair_counts: dict[str, int | None] = field(default_factory=dict)
    """'a|b' -> data connections of that heavy address pair (None: no clear split)."""
    candidates: list[int] = field(default_factory=list)
    """ranks per address that the counts allow when they cannot single one out."""

    def as_dict(self) -> dict:
        return {"ranks": self.ranks, "hidden_factor": self.hidden_factor, "basis": self.basis,
                "why": self.why, "pair_counts": dict(self.pair_counts), "candidates": list(self.candidates)}


def _data_connections(sizes: list[float], cfg: RanksPerAddressConfig) -> int | None:
    """How many of one pair's connections carry its data: the equal-sized top, clearly apart from the rest."""
    s = sorted((x for x in sizes if x > 0), reverse=True)
    if not s:
        return None
    top = [x for x in s if x * cfg.equal_share_ratio >= s[0]]
    rest = s[len(top):]
    if rest and rest[0] * cfg.setup_gap_ratio > top[-1]:
        return None
    return len(top)


def _tcp_pair_counts(tcp: pl.DataFrame, pairs: list[tuple[str, str]],
                     cfg: RanksPerAddressConfig) -> dict[str, tuple[int | None, str]]:
    conn = tcp.with_columns(connection_columns()).group_by("a", "b", "a_port", "b_port").agg(
        bytes=pl.col("_bytes").sum())
    by_pair = {(a, b): g for (a, b), g in conn.group_by("a", "b")}
    out = {}
    for a, b in pairs:
        key = f"{min(a, b)}|{max(a, b)}"
        g = by_pair.get((min(a, b), max(a, b)))
        if g is None:
            out[key] = (None, "no TCP connection with ports")
            continue
        g = g.sort("bytes", descending=True)
        k = _data_connections(g["bytes"].to_list(), cfg)
        if k is None:
            out[key] = (None, "no clear split between data and set-up connections")
            continue
        data = g.head(k)
        na, nb = data["a_port"].n_unique(), data["b_port"].n_unique()
        if k > 1 and (na < k or nb < k):
            # several sockets to one listening port: one process at that end, so not k ranks
            out[key] = (None, f"{k} data connections share ports ({na} and {nb} distinct)")
            continue
        out[key] = (k, "")
    return out


def _roce_pair_counts(roce: pl.DataFrame, pairs: list[tuple[str, str]], conn_col: str,
                      cfg: RanksPerAddressConfig) -> dict[str, tuple[int | None, str]]:
    # lazy: the eager group_by held ~0.2 GiB more for 1.6M records
    per_dir = roce.lazy().group_by("src_addr", "dst_addr", conn_col).agg(bytes=pl.col("_bytes").sum(),
                                                                         kept=pl.col("_packets").sum()).collect()
    by_dir = {(s, d): (g["bytes"].to_list(), float(g["kept"].sum()))
              for (s, d), g in per_dir.group_by("src_addr", "dst_addr")}
    out = {}
    for a, b in pairs:
        key = f"{min(a, b)}|{max(a, b)}"
        ks, thin = [], False
        for d in ((a, b), (b, a)):
            if d not in by_dir:
                continue
            sizes, kept = by_dir[d]
            k = _data_connections(sizes, cfg)
            ks.append(k)
            # sampling may have missed a whole queue pair: the count holds only with packets to spare
            thin |= k is not None and kept < cfg.min_sampled_packets * k
        if not ks or None in ks or len(set(ks)) > 1:
            out[key] = (None, f"queue pairs per direction {ks}")
        elif thin:
            out[key] = (None, f"too few sampled packets to count {ks[0]} queue pair(s)")
        else:
            out[key] = (ks[0], "")
    return out


def _power_of_two_divisors(k: int) -> list[int]:
    return [d for d in (1 << i for i in range(k.bit_length())) if k % d == 0]


def ranks_per_address(flows: pl.DataFrame, pairs: list[tuple[str, str]],
                      config: RanksPerAddressConfig | None = None) -> RanksPerAddress:
    """Rank endpoints per address from the connections of a job's heavy address pairs.

    Needs flow columns src_addr, dst_addr, src_port, dst_port, protocol,
    size_bytes (est_bytes or est_size_bytes when present: sampling-scaled),
    and dst_qp for RoCE. ``pairs`` are the job's heavy (training) address
    pairs. Every pair must give the same count for an answer.
    """
    cfg = config or RanksPerAddressConfig()
    if not pairs or flows.is_empty():
        return RanksPerAddress(None, None, "none", "no heavy address pairs")
    size = next((c for c in ("est_bytes", "est_size_bytes") if c in flows.columns), "size_bytes")
    # only the columns read: the filters below copy what they are given, and a job's records have many more
    kept = [c for c in ("src_addr", "dst_addr", "src_port", "dst_port", "protocol", "dst_qp") if c in flows.columns]
    f = flows.select(*kept, _bytes=pl.coalesce(pl.col(size), pl.col("size_bytes")).cast(pl.Float64),
                     _packets=(pl.col("num_packets") if "num_packets" in flows.columns
                               else pl.lit(None, pl.Int64)).cast(pl.Float64).fill_null(float("inf")))
    proto = pl.col("protocol") if "protocol" in f.columns else pl.lit(None, pl.Int32)
    ports = pl.col("src_port").is_not_null() & pl.col("dst_port").is_not_null()
    # only the job's heavy pairs count (a stray control connection between two of its hosts is not its transport)
    f = on_pairs(f, pairs)
    tcp = f.filter((proto == 6).fill_null(False) & ports)
    roce = f.filter((pl.col("dst_port") == ROCE_PORT).fill_null(False) & pl.col("src_port").is_not_null())
    with_qp = "dst_qp" in f.columns and roce.filter(pl.col("dst_qp").is_not_null()).height == roce.height
    tcp_bytes, roce_bytes = float(tcp["_bytes"].sum() or 0), float(roce["_bytes"].sum() or 0)
    if tcp.height and tcp_bytes >= roce_bytes:
        basis, counts = "tcp_connections", _tcp_pair_counts(tcp, pairs, cfg)
    elif roce.height:
        basis = "roce_dst_qp" if with_qp else "roce_source_ports"
        counts = _roce_pair_counts(roce, pairs, "dst_qp" if with_qp else "src_port", cfg)
    else:
        return RanksPerAddress(None, None, "none", "no TCP ports or RoCE queue pairs to count connections by")
    pair_counts = {k: v for k, (v, _) in counts.items()}
    undecided = {k: why for k, (v, why) in counts.items() if v is None}
    if undecided:
        k0, why0 = next(iter(undecided.items()))
        return RanksPerAddress(None, None, basis, f"{len(undecided)} of {len(counts)} heavy pairs undecided "
                               f"(e.g. {k0}: {why0})", pair_counts)
    seen = sorted(set(pair_counts.values()))
    if len(seen) > 1:
        return RanksPerAddress(None, None, basis, f"heavy pairs disagree: data connections per pair {seen}",
                               pair_counts)
    k = seen[0]
    if basis != "tcp_connections" and k > 1:
        cands = _power_of_two_divisors(k)
        if cands == [1]:
            return RanksPerAddress(1, k, basis, f"{k} queue pairs per address pair: an odd count is queue pairs "
                                   "of one rank pair (ranks sharing an address are a power of two)", pair_counts)
        return RanksPerAddress(None, k, basis, f"{k} queue pairs per address pair: ranks or channels per rank "
                               f"pair cannot be told apart (ranks per address one of {cands})", pair_counts, cands)
    return RanksPerAddress(k, k, basis, f"{k} data connection(s) on each of {len(pair_counts)} heavy pairs",
                           pair_counts)


def degrees_with_hidden_ranks(addresses: int, dp: int, pp: int, rpa: RanksPerAddress) -> tuple[int, int | None, str]:
    """(world size, tp, note) of a dp x pp address grid once ranks per address are known.

    The ranks that share an address sit at one grid position (the grid is
    found between addresses), so they multiply the degree the grid leaves
    over, which is tensor parallelism in Megatron's order (tp innermost). An
    unknown count or a hidden factor that cannot be told as ranks gives tp
    None (with the reason), never the one-rank-per-address guess.
    """
    rest = addresses // (dp * pp) if dp * pp and addresses % (dp * pp) == 0 else None
    if rpa.ranks is not None:
        tp = rest * rpa.ranks if rest is not None else None
        return addresses * rpa.ranks, tp, f"{rpa.ranks} rank(s) per address ({rpa.basis})"
    if rpa.hidden_factor is not None and rpa.hidden_factor > 1:
        alts = f"; tp one of {[rest * c for c in rpa.candidates]}" if rest and rpa.candidates else ""
        return addresses, None, f"hidden factor {rpa.hidden_factor} per address pair: {rpa.why}{alts}"
    # ranks that share an address never show on the wire: without a count, tp is unknown, never a guess
    return addresses, None, (f"ranks per address unknown ({rpa.why}): tp not reported (the addresses alone "
                             f"give {rest} per grid position)")
