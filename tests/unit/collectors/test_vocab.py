import polars as pl
import pytest

from rankscope.collectors.vocab import (
    DTYPES,
    dtype_name,
    dtype_size,
    kernel_category_expr,
    kernel_class_expr,
    kernel_op,
    normalise_op,
)


@pytest.mark.parametrize("raw,name,size", [
    ("Float", "float32", 4), ("c10::BFloat16", "bfloat16", 2), ("torch.float16", "float16", 2),
    ("ncclHalf", "float16", 2), ("ncclFloat8e4m3", "float8_e4m3fn", 1), ("Long", "int64", 8),
    ("bf16", "bfloat16", 2), ("c10::complex<float>", "complex64", 8), ("Mystery", "mystery", None),
    (None, None, None), ("", None, None)])
def test_every_spelling_of_a_dtype_has_one_name_and_size(raw, name, size):
    assert (dtype_name(raw), dtype_size(raw)) == (name, size)


def test_dtype_aliases_are_unique():
    seen = [a for n, (_, al) in DTYPES.items() for a in (n, *al)]
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize("raw,op", [("allreduce", "all_reduce"), ("c10d::allreduce_", "all_reduce"),
                                    ("nccl:_all_gather_base", "all_gather"), ("gloo:all_reduce", "all_reduce"),
                                    ("reduce_scatter_tensor_coalesced", "reduce_scatter"), ("frobnicate", None)])
def test_normalise_op(raw, op):
    assert normalise_op(raw) == op


def test_kernel_op_and_classes_share_one_table():
    assert kernel_op("ncclDevKernel_AllGather_RING_LL") == "all_gather"
    names = ["ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "flash_fwd_kernel", "Memcpy HtoD",
             "void at::native::vectorized_elementwise_kernel<4>", "multi_tensor_apply_kernel", "layer_norm_fwd",
             "index_select_kernel", "weird"]
    df = pl.DataFrame({"name": names}).select(kernel_class_expr().alias("c"), kernel_category_expr().alias("cat"))
    assert df["c"].to_list() == ["gemm_cublas", "flash_attention", "memcpy", "elementwise", "optimizer",
                                 "reduction", "data_movement", "other"]
    assert df["cat"].to_list() == ["gemm", "attention", "memory", "elementwise", "optimizer", "reduction",
                                   "memory", "other"]
