"""Hand-built flow records and edges shared by the flows-only tests."""

import polars as pl

STEP = 1_000_000_000
COLS = ["src_addr", "dst_addr", "start_ns", "end_ns", "est_bytes", "is_data"]


def frame(rows):
    return pl.DataFrame(rows, schema=COLS, orient="row")


def directed_edges(rows):
    """Edges from (a, b, bytes a->b, bytes b->a, first_ab, first_ba) with the payload columns peeling reads."""
    e = pl.DataFrame(rows, schema=["a", "b", "data_ab", "data_ba", "first_ab", "first_ba"], orient="row")
    return e.with_columns(bytes=pl.col("data_ab") + pl.col("data_ba"), bytes_ab="data_ab", bytes_ba="data_ba",
                          data_symmetry=pl.min_horizontal("data_ab", "data_ba")
                          / pl.max_horizontal("data_ab", "data_ba"))


def endpoints(e):
    return set(e["a"].to_list()) | set(e["b"].to_list())


JOB_OR_STORAGE_HOSTS = ["10.0.0.1", "10.0.0.2"]
JOB_OR_STORAGE_SERVERS = ["10.0.0.3", "10.0.0.5", "10.1.0.4"]


def job_or_storage_links(replication_scale: float = 1.0):
    """(a, b, bytes a->b, bytes b->a) of two hosts exchanging 9.8 GB both ways, writing to and reading from
    three servers (one-way and lopsided links) that replicate to each other both ways, 3.1 GB a pair times
    ``replication_scale`` (dev corpus, seed 2): either set could be the job and the other its storage."""
    (h1, h2), servers = JOB_OR_STORAGE_HOSTS, JOB_OR_STORAGE_SERVERS
    links = [(h1, h2, 4.96e9, 4.87e9), (h2, servers[0], 1.48e9, 0.0), (h1, servers[0], 9.3e8, 2.6e8),
             (h1, servers[2], 4.9e8, 0.0), (h2, servers[2], 0.0, 3.0e8)]
    return links + [(s, t, 1.55e9 * replication_scale, 1.58e9 * replication_scale)
                    for i, s in enumerate(servers) for t in servers[i + 1:]]


def job_or_storage_flows():
    """Flow records of :func:`job_or_storage_links`: eight bursts each way, 100 ms apart, one exporter,
    unsampled RoCE."""
    rows = []
    for a, b, ab, ba in job_or_storage_links():
        for k in range(8):
            t = 1_764_000_000_000_000_000 + k * 100_000_000
            rows += [(a, b, int(ab / 8), t, t + 20_000_000)] if ab else []
            rows += [(b, a, int(ba / 8), t + 1_000_000, t + 21_000_000)] if ba else []
    flows = pl.DataFrame(rows, schema=["src_addr", "dst_addr", "size_bytes", "start_ns", "end_ns"], orient="row")
    return flows.with_columns(src_port=pl.lit(49152), dst_port=pl.lit(4791), protocol=pl.lit(17),
                              sampling_rate=pl.lit(1), exporter=pl.lit("10.9.0.1"), job=pl.lit("fabric"),
                              source=pl.lit("ipfix"))
