"""Where each endpoint hangs in the fabric: its host, leaf, pod and (optionally) spine.

A topology comes from a file (``endpoint,host,leaf,pod[,spine]``, one row per NIC address or per rank)
or, without one, from the flow records: each exporter meters one leaf, so an endpoint whose sent traffic
is metered by one exporter hangs off that exporter's leaf. Host and pod are then unknown.
"""

from __future__ import annotations

import csv
from pathlib import Path

import polars as pl

from rankscope.collectors.errors import UsageError
from rankscope.collectors.record_class import record

COLUMNS = ("endpoint", "host", "leaf", "pod")
OPTIONAL = ("spine",)


@record
class Topology:
    """endpoint -> host, leaf, pod, spine (null where unknown), and how it was obtained."""

    rows: tuple
    """(endpoint, host, leaf, pod, spine) per endpoint, None where unknown: a tuple, so that a diagnosis'
    options (and the result cache's key) hold the topology itself, not a path to a file that may change."""
    source: str
    """``file: <path>`` or ``inferred from flow exporters``."""
    notes: tuple = ()

    @property
    def frame(self) -> pl.DataFrame:
        """columns endpoint, host, leaf, pod, spine (all strings)."""
        return pl.DataFrame(list(self.rows), schema={c: pl.Utf8 for c in COLUMNS + OPTIONAL}, orient="row")

    def leaf_of(self) -> dict[str, str | None]:
        return {r[0]: r[2] for r in self.rows}

    def column(self, name: str) -> dict[str, str | None]:
        i = (COLUMNS + OPTIONAL).index(name)
        return {r[0]: r[i] for r in self.rows}


def read_topology(path: str | Path) -> Topology:
    """A topology file; a bad row is named (file, line, what was expected) and the good rows still load."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageError(f"--topology {path}: cannot read it ({e.strerror})") from e
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise UsageError(f"--topology {path}: header {','.join(header) or '(empty)'} lacks {', '.join(missing)}; "
                         f"expected {','.join(COLUMNS)} and optionally spine")
    rows, notes, seen = [], [], set()
    for line, raw in enumerate(reader, start=2):
        row = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        empty = [c for c in COLUMNS if not row.get(c)]
        if empty:
            notes.append(f"{path}: line {line} skipped: empty {', '.join(empty)} (expected {','.join(COLUMNS)})")
            continue
        if row["endpoint"] in seen:
            notes.append(f"{path}: line {line} skipped: endpoint {row['endpoint']} listed twice")
            continue
        seen.add(row["endpoint"])
        rows.append({c: row.get(c) or None for c in COLUMNS + OPTIONAL})
    if not rows:
        raise UsageError(f"--topology {path}: no usable row; expected {','.join(COLUMNS)} per endpoint")
    return Topology(tuple(tuple(r[c] for c in COLUMNS + OPTIONAL) for r in rows), f"file: {path}", tuple(notes))


def payload_records(job_flows: pl.DataFrame) -> pl.DataFrame:
    """The payload records (``is_data``) of a job's flows with only the columns that :func:`infer_topology`
    and :func:`leaf_exporters` read: src_addr, dst_addr, exporter, size_bytes (the filter copies what it is
    given, and a job's records have many more columns)."""
    return job_flows.select("src_addr", "dst_addr", "exporter", "size_bytes", "is_data").filter(pl.col("is_data"))


def infer_topology(flow: pl.DataFrame) -> Topology:
    """The leaf of each sending endpoint from the exporters that meter its traffic.

    Each exporter meters one leaf's senders, so the leaf of an endpoint is the exporter that saw most of
    the bytes it sent; an endpoint only ever seen as a receiver is placed at the exporter that saw most of
    the bytes sent to it (its leaf is then a guess, and said so). Host, pod and spine stay unknown.
    """
    if flow.is_empty():
        return Topology((), "inferred from flow exporters", ("no flow records: no topology",))
    by = (flow.group_by("src_addr", "exporter").agg(pl.col("size_bytes").sum().alias("b"))
          .sort(["src_addr", "b", "exporter"], descending=[False, True, False])
          .group_by("src_addr", maintain_order=True).agg(pl.col("exporter").first(), pl.len().alias("n")))
    leaf = dict(zip(by["src_addr"].to_list(), by["exporter"].to_list()))
    several = by.filter(pl.col("n") > 1).height
    recv = (flow.filter(~pl.col("dst_addr").is_in(list(leaf)))
            .group_by("dst_addr", "exporter").agg(pl.col("size_bytes").sum().alias("b"))
            .sort(["dst_addr", "b", "exporter"], descending=[False, True, False])
            .group_by("dst_addr", maintain_order=True).agg(pl.col("exporter").first()))
    notes = [f"topology inferred from flow exporters: {len(leaf)} sending endpoints placed at the exporter "
             "that meters their traffic (one exporter per leaf); host, pod and spine unknown"]
    if several:
        notes.append(f"{several} endpoints' traffic was metered by more than one exporter: placed at the one "
                     "that saw most of it")
    if recv.height:
        notes.append(f"{recv.height} endpoints only receive: placed at the exporter of their senders (a guess)")
        leaf.update(zip(recv["dst_addr"].to_list(), recv["exporter"].to_list()))
    rows = tuple((e, None, x, None, None) for e, x in sorted(leaf.items()))
    return Topology(rows, "inferred from flow exporters", tuple(notes))


def leaf_exporters(flow: pl.DataFrame, topology: Topology) -> dict[str, str]:
    """leaf -> the exporter that meters it: the one that saw most of the bytes its endpoints sent."""
    if flow.is_empty() or not topology.rows:
        return {}
    leaves = topology.frame.select(pl.col("endpoint").alias("src_addr"), "leaf").drop_nulls()
    # the join copies what it is given: only the columns read, not the records' every column
    by = (flow.select("src_addr", "exporter", "size_bytes").join(leaves, on="src_addr")
          .group_by("leaf", "exporter").agg(pl.col("size_bytes").sum().alias("b"))
          .sort(["leaf", "b", "exporter"], descending=[False, True, False])
          .group_by("leaf", maintain_order=True).agg(pl.col("exporter").first()))
    return dict(zip(by["leaf"].to_list(), by["exporter"].to_list()))
