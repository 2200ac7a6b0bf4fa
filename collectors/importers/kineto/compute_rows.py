"""Compute of a Kineto trace -> compute_op rows: coarse spans, GEMMs and GPU kernels.

- Coarse spans: ``record_function`` ranges whose names match the forward,
  backward and optimizer regexes (defaults cover ``forward``/``## forward ##``,
  Megatron's ``forward-compute``/``backward-compute``, ``Optimizer.step#...``;
  override with ImportOptions.extra ``forward_regex``, ``backward_regex``,
  ``optimizer_regex``). Without any backward range, autograd engine events
  (``autograd::engine::evaluate_function: ...``) stand for the backward pass.
- GEMMs: ``aten::mm|addmm|bmm|baddbmm`` cpu_ops (and ``aten::matmul|linear``
  when no such op runs inside them) with m/n/k, batch, dtype and layout from
  ``Input Dims``/``Input type``/``Input Strides``; flops = 2·m·n·k·batch.
  When a GPU kernel was launched from the op (same External id), the kernel
  row carries the shape instead and the CPU op is not stored again.
- GPU kernels (``cat == kernel``, NCCL kernels excluded: they are comm_op) with
  grid, block, stream, device and a category from one regex table.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from rankscope.collectors.errors import UsageError
from rankscope.collectors.importers.kineto.chrome_trace import KinetoTrace, containing, steps_at
from rankscope.collectors.importers.kineto.comm_rows import launches
from rankscope.collectors.vocab import NCCL_KERNEL, dtype_name, kernel_category_expr

SPAN_REGEX = {
    "forward": r"(?i)^(##\s*)?forward(\s*##)?$|^forward[-_ ]compute$|^forward_step$|^forward-backward$",
    "backward": r"(?i)^(##\s*)?backward(\s*##)?$|^backward[-_ ]compute$|^backward_step$",
    "optimizer": r"(?i)^(##\s*)?optimizer(\s*##)?$|^optimizer[-_ ]step$|^Optimizer\.step#",
}
AUTOGRAD = "autograd::engine::evaluate_function"
LEAF_GEMM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
WRAPPER_GEMM = ("aten::matmul", "aten::linear")

def span_regexes(extra: dict) -> dict[str, re.Pattern]:
    out = {}
    for cat, default in SPAN_REGEX.items():
        pat = extra.get(f"{cat}_regex", default)
        try:
            out[cat] = re.compile(pat)
        except (re.error, TypeError) as e:
            raise UsageError(f"--opt {cat}_regex={pat!r} is not a valid regular expression: {e}") from None
    return out


def _spans(tr: KinetoTrace, extra: dict) -> pl.DataFrame:
    f = tr.frame.filter(pl.col("cat").is_in(["user_annotation", "cpu_op", "python_function"]))
    cats = pl.lit(None, pl.String)
    for cat, rx in reversed(list(span_regexes(extra).items())):
        cats = pl.when(pl.col("name").str.contains(rx.pattern)).then(pl.lit(cat)).otherwise(cats)
    spans = f.with_columns(cats.alias("category")).filter(pl.col("category").is_not_null())
    if not (spans["category"] == "backward").any():
        auto = f.filter(pl.col("name").str.starts_with(AUTOGRAD))
        # Only the outermost engine events: nested ones would count the same time twice.
        outer = containing(auto.select("tid", "ts_ns", "dur_ns"), auto["tid"].fill_null(-1).to_numpy(),
                           auto["ts_ns"].to_numpy() - 1)
        auto = auto.filter(pl.Series(outer < 0)).with_columns(pl.lit("backward").alias("category"))
        spans = pl.concat([spans, auto])
    # A span inside another of the same category on the same thread is the same time twice: keep the outer.
    spans = spans.sort("tid", "ts_ns", -pl.col("dur_ns")).with_columns(
        (pl.col("ts_ns") + pl.col("dur_ns")).cum_max().shift(1).over("tid", "category").alias("_prev_end"))
    spans = spans.filter(pl.col("_prev_end").is_null() | (pl.col("ts_ns") >= pl.col("_prev_end")))
    return spans.select("idx", "name", "category", "tid", "ts_ns", "dur_ns",
                        pl.lit(None, pl.Int64).alias("m"), pl.lit(None, pl.Int64).alias("n"),
                        pl.lit(None, pl.Int64).alias("k"), pl.lit(None, pl.Int64).alias("batch"),
                        pl.lit(None, pl.String).alias("dtype"), pl.lit(None, pl.String).alias("layout"))


def _is_t(strides) -> bool | None:
    """A 2-D operand stored column-major (transposed view), from its strides."""
    if isinstance(strides, list) and len(strides) >= 2 and all(isinstance(s, int) for s in strides[-2:]):
        return strides[-2] == 1 and strides[-1] != 1
    return None


def gemm_shape(name: str, a: dict) -> tuple | None:
    """(m, n, k, batch, dtype, layout) of a GEMM-like aten op from its args, None when not derivable."""
    dims = a.get("Input Dims") or []
    types = a.get("Input type") or []
    strides = a.get("Input Strides") or []
    first = 1 if name in ("aten::addmm", "aten::baddbmm") else 0
    if len(dims) < first + 2:
        return None
    x, w = dims[first], dims[first + 1]
    if not (isinstance(x, list) and isinstance(w, list) and x and w):
        return None
    if not all(isinstance(d, int) for d in x + w):
        return None
    if name == "aten::linear":
        # weight is [out, in]: y = x @ w.T
        if len(w) != 2:
            return None
        m, k, n, batch = int(np.prod(x[:-1])) if len(x) > 1 else 1, x[-1], w[0], 1
    elif len(x) == 2 and len(w) == 2:
        m, k, n, batch = x[0], x[1], w[1], 1
    elif len(x) >= 3 and len(w) >= 2:
        m, k, n = x[-2], x[-1], w[-1]
        batch = int(np.prod(x[:-2]))
    else:
        return None
    dtype = dtype_name(types[first]) if len(types) > first else None
    layout = None
    if len(strides) >= first + 2:
        ta, tb = _is_t(strides[first]), _is_t(strides[first + 1])
        if name == "aten::linear" and tb is not None:
            tb = not tb
        if ta is not None and tb is not None:
            layout = ("t" if ta else "n") + ("t" if tb else "n")
    return int(m), int(n), int(k), int(batch), dtype, layout


def _gemm_ops(tr: KinetoTrace) -> tuple[pl.DataFrame, dict]:
    f = tr.frame.filter((pl.col("cat") == "cpu_op") & pl.col("name").is_in(LEAF_GEMM + WRAPPER_GEMM))
    leaf = f.filter(pl.col("name").is_in(LEAF_GEMM))
    wrap = f.filter(pl.col("name").is_in(WRAPPER_GEMM))
    if wrap.height and leaf.height:
        # A wrapper that runs a leaf GEMM inside is the same work: keep the leaf.
        holder = containing(wrap.select("tid", "ts_ns", "dur_ns"), leaf["tid"].fill_null(-1).to_numpy(),
                            leaf["ts_ns"].to_numpy())
        wrap = wrap.with_row_index("_r").filter(~pl.col("_r").is_in(holder[holder >= 0].tolist())).drop("_r")
    ops = pl.concat([leaf, wrap])
    args = tr.args(ops["idx"])
    shapes = [gemm_shape(n, a) for n, a in zip(ops["name"], args, strict=True)]
    ext = {a.get("External id"): i for i, a in enumerate(args) if a.get("External id") is not None}
    cols = list(zip(*[s if s is not None else (None,) * 6 for s in shapes], strict=True)) or [[]] * 6
    out = ops.select("idx", "name", "tid", "ts_ns", "dur_ns").with_columns(
        pl.lit("gemm").alias("category"),
        *[pl.Series(c, list(v), dtype=t) for c, v, t in zip(
            ("m", "n", "k", "batch", "dtype", "layout"), cols,
            (pl.Int64, pl.Int64, pl.Int64, pl.Int64, pl.String, pl.String), strict=True)])
    return out, {"by_ext": ext, "rows": out}


def _kernels(tr: KinetoTrace, gemm: dict) -> tuple[pl.DataFrame, set]:
    k = tr.frame.filter((pl.col("cat") == "kernel") & ~pl.col("name").str.contains(NCCL_KERNEL))
    args = tr.args(k["idx"])
    cat = kernel_category_expr("name")
    rows = gemm["rows"]
    used = set()
    link = []
    for a in args:
        i = gemm["by_ext"].get(a.get("External id"), -1)
        link.append(i)
        if i >= 0:
            used.add(i)

    def from_op(col):
        src = rows[col].to_list() if rows.height else []
        return [src[i] if i >= 0 else None for i in link]

    def xyz(v):
        return ",".join(map(str, v)) if isinstance(v, list) else None

    _, l_ts, _ = launches(tr, [a.get("correlation") for a in args])
    out = k.select("idx", "name", "ts_ns", "dur_ns").with_columns(
        cat.alias("category"),
        # a kernel belongs to the step that launched it, even when it runs after the step's CPU end
        pl.Series("t_step", np.where(l_ts >= 0, l_ts, k["ts_ns"].to_numpy()), dtype=pl.Int64),
        pl.Series("tid", [a.get("stream") if isinstance(a.get("stream"), int) else None for a in args],
                  dtype=pl.Int64),
        pl.Series("device", [a.get("device") if isinstance(a.get("device"), int) else None for a in args],
                  dtype=pl.Int32),
        pl.Series("grid", [xyz(a.get("grid")) for a in args], dtype=pl.String),
        pl.Series("block", [xyz(a.get("block")) for a in args], dtype=pl.String),
        *[pl.Series(c, from_op(c), dtype=t) for c, t in (
            ("m", pl.Int64), ("n", pl.Int64), ("k", pl.Int64), ("batch", pl.Int64), ("dtype", pl.String),
            ("layout", pl.String))])
    # A kernel launched from a GEMM op is a GEMM whatever its name says.
    out = out.with_columns(pl.when(pl.col("m").is_not_null()).then(pl.lit("gemm"))
                           .otherwise(pl.col("category")).alias("category"))
    return out, used


def compute_rows(tr: KinetoTrace, steps: pl.DataFrame, extra: dict) -> tuple[pl.DataFrame, dict]:
    """compute_op rows of one trace (spans, CPU GEMMs without a kernel, GPU kernels) and notes."""
    spans = _spans(tr, extra)
    gemms, gemm_index = _gemm_ops(tr)
    kernels, used = _kernels(tr, gemm_index)
    if used:
        gemms = gemms.with_row_index("_r").filter(~pl.col("_r").is_in(sorted(used))).drop("_r")
    parts = [p.with_columns(pl.lit(None, pl.Int32).alias("device"), pl.lit(None, pl.String).alias("grid"),
                            pl.lit(None, pl.String).alias("block"), pl.col("ts_ns").alias("t_step"))
             for p in (spans, gemms)]
    cols = ["name", "category", "tid", "ts_ns", "dur_ns", "m", "n", "k", "batch", "dtype", "layout",
            "device", "grid", "block", "t_step"]
    df = pl.concat([p.select(cols) for p in [*parts, kernels]], how="vertical_relaxed")
    notes = {"gemm_cpu_ops": int(gemms.height), "kernels": int(kernels.height),
             "gemm_kernels_with_shape": len(used)}
    if df.height == 0:
        return df, notes
    step = steps_at(steps, df["t_step"].to_numpy())
    df = df.with_columns(
        pl.lit(tr.rank, pl.Int32).alias("rank"),
        pl.col("ts_ns").alias("start_ns"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
        pl.Series("step", step).fill_nan(None).cast(pl.Int64),
        (2.0 * pl.col("m") * pl.col("n") * pl.col("k") * pl.col("batch").fill_null(1)).alias("flops"),
        pl.col("tid").alias("stream"), pl.lit(tr.host).alias("host"), pl.lit(tr.pid, pl.Int64).alias("pid"),
    ).drop("ts_ns", "dur_ns", "tid", "t_step")
    return df, notes
