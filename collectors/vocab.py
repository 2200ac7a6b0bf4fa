"""Format-neutral vocabularies shared by every importer and analysis: one table each.

- dtypes: the canonical (torch) name and size of every spelling the sources use
  (``Float``, ``c10::BFloat16``, ``ncclFloat16``, ``bf16``, ...);
- collective op names: any source's spelling -> the binding op name
  (``allreduce``, ``c10d::allreduce_``, ``nccl:_all_gather_base``, ``gloo:all_reduce``);
- kernel classes: one ordered regex table, HTA style, giving a kernel or op name
  its class (``gemm_cublas``, ``flash_attention``...) and its compute_op category.

Importers of every format and the analysis ask this module, so a new spelling
is added in one place.
"""

from __future__ import annotations

import re

import polars as pl

# ---------------------------------------------------------------- dtypes

DTYPES: dict[str, tuple[int, tuple[str, ...]]] = {
    # canonical name: (bytes per element, other spellings, lower case, without torch./c10:: prefixes)
    "float32": (4, ("float", "fp32", "ncclfloat32", "ncclfloat")),
    "float64": (8, ("double", "fp64", "ncclfloat64", "nccldouble")),
    "float16": (2, ("half", "fp16", "ncclfloat16", "ncclhalf")),
    "bfloat16": (2, ("bf16", "ncclbfloat16")),
    "tf32": (4, ()),
    "float8_e4m3fn": (1, ("fp8", "float8_e4m3", "ncclfloat8e4m3", "float8_e4m3fnuz")),
    "float8_e5m2": (1, ("ncclfloat8e5m2", "float8_e5m2fnuz")),
    "int8": (1, ("char", "signed char", "int8_t", "ncclint8", "ncclchar")),
    "uint8": (1, ("unsigned char", "byte", "uint8_t", "nccluint8")),
    "int16": (2, ("short",)),
    "int32": (4, ("int", "ncclint32", "ncclint")),
    "uint32": (4, ("nccluint32",)),
    "int64": (8, ("long", "long int", "ncclint64")),
    "uint64": (8, ("nccluint64",)),
    "bool": (1, ()),
    "complex64": (8, ("complexfloat", "complex<float>")),
    "complex128": (16, ("complexdouble", "complex<double>")),
}
"""One row per dtype: its size and every spelling seen in Kineto, flight recorder, NCCL and nsys."""

_ALIAS = {a: name for name, (_, aliases) in DTYPES.items() for a in (name, *aliases)}


def _dtype_key(raw) -> str | None:
    if not isinstance(raw, str) or not raw.strip():
        return None
    return raw.strip().lower().removeprefix("torch.").removeprefix("c10::")


def dtype_name(raw) -> str | None:
    """Canonical (torch) dtype name: 'Float' -> float32, 'c10::BFloat16' -> bfloat16, 'ncclHalf' -> float16.

    An unknown spelling comes back lower-cased without its prefix, so it is kept rather than lost.
    """
    k = _dtype_key(raw)
    return None if k is None else _ALIAS.get(k, k)


def dtype_size(raw) -> int | None:
    """Bytes per element of any spelling of a dtype, None when unknown."""
    k = _dtype_key(raw)
    name = _ALIAS.get(k) if k is not None else None
    return DTYPES[name][0] if name is not None else None


# ---------------------------------------------------------------- collective ops

COLLECTIVE_OPS = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all", "alltoallv": "all_to_all",
    "send": "send", "recv": "recv", "barrier": "barrier", "gather": "gather", "scatter": "scatter",
    "monitoredbarrier": "barrier", "recvanysource": "recv",
}
"""Source spelling (lower case, no underscores, no namespace) -> binding op name."""

NCCL_KERNEL = r"^(void )?nccl(Dev)?Kernel_"
"""NCCL's device kernels (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``): communication, not compute."""

_SUFFIXES = re.compile(r"(base|intotensor|tensor|coalesced|single)+$")
_KERNEL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


def normalise_op(raw) -> str | None:
    """'allreduce', 'c10d::allreduce_', 'nccl:_all_gather_base', 'gloo:all_reduce' -> binding op name."""
    if not isinstance(raw, str):
        return None
    s = raw.lower().split("::")[-1].split(":")[-1]
    s = s.replace("_", "")
    return COLLECTIVE_OPS.get(s) or COLLECTIVE_OPS.get(_SUFFIXES.sub("", s))


def kernel_op(name: str) -> str | None:
    """Binding op name of a NCCL kernel name, None when it is not one."""
    m = _KERNEL_OP.search(name)
    return normalise_op(m.group(1)) if m else None


# ---------------------------------------------------------------- kernel classes

KERNEL_CLASSES: tuple[tuple[str, str, str], ...] = (
    # (class, compute_op category, case-insensitive regex on the kernel or op name); first match wins.
    ("nccl", "other", r"^nccl|ncclDevKernel|ncclKernel|c10d::|gloo:"),
    ("memcpy", "memory", r"^memcpy|^memset|Memcpy [DHP]to[DHP]|Memset|cudaMemcpy"),
    ("flash_attention", "attention", r"flash|fmha|_scaled_dot_product_flash"),
    ("attention", "attention", r"scaled_dot_product|attention|attn|sdpa"),
    ("gemm_cutlass", "gemm", r"cutlass.*gemm|cutlass_\d+x\d+|sm\d+_xmma_gemm|gemm.*cutlass"),
    ("gemm_cublas", "gemm", r"^(ampere|volta|turing|hopper|sm\d+)_.*gemm|cublas|gemvx?|s\d+gemm|"
                            r"gemmSN|gemmk1|splitKreduce"),
    ("gemm_triton", "gemm", r"triton.*(mm|matmul|gemm)"),
    ("gemm_aten", "gemm", r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addbmm)$"),
    ("gemm_other", "gemm", r"gemm|matmul|cutlass|xmma|_mma_|wgmma|ampere_.*_\d+x\d+"),
    ("optimizer", "optimizer", r"multi_tensor_apply|adam|sgd|lamb|optimizer"),
    ("reduction", "reduction", r"reduce|reduction|softmax|norm|sum_|mean|argmax"),
    ("data_movement", "memory", r"copy|cat_|gather|scatter|index|embedding|permute|transpose"),
    ("elementwise", "elementwise", r"elementwise|vectorized|unrolled|pointwise|activation|gelu|relu|silu|"
                                   r"aten::(add|mul|fill_)|add|mul"),
)
"""Ordered (class, category, regex); the first pattern that matches names a kernel's class."""

GEMM_CLASSES = tuple(c for c, cat, _ in KERNEL_CLASSES if cat == "gemm")


def _first_match(name: str, value_of) -> pl.Expr:
    # when/then chains evaluate in order, so build from the last entry backwards.
    expr = pl.lit("other")
    for row in reversed(KERNEL_CLASSES):
        expr = pl.when(pl.col(name).str.contains("(?i)" + row[2])).then(pl.lit(value_of(row))).otherwise(expr)
    return expr


def kernel_class_expr(name: str = "name") -> pl.Expr:
    """Class of each name in column ``name`` (``other`` when no pattern matches)."""
    return _first_match(name, lambda row: row[0])


def kernel_category_expr(name: str = "name") -> pl.Expr:
    """compute_op category of each kernel name in column ``name`` (``other`` when no pattern matches)."""
    return _first_match(name, lambda row: row[1])
