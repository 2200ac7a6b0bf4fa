import polars as pl
import pytest

from rankscope.analysis.kernels.alignment import (
    AlignmentConfig,
    alignment_findings,
    check_dim,
    required_elements,
    tp_split_findings,
)
from rankscope.analysis.kernels.classes import class_of, classify
from rankscope.collectors.errors import ConfigError

from .gemm_frames import gemm_frame


@pytest.mark.parametrize("dtype,expected", [("bfloat16", (8, 64)), ("float16", (8, 64)), ("torch.float16", (8, 64)),
                                            ("float8_e4m3fn", (16, 128)), ("float32", None),
                                            ("tf32", (4, 32)), ("mystery", None)])
def test_required_elements_per_dtype(dtype, expected):
    assert required_elements(dtype) == expected


def test_check_dim_severities():
    assert check_dim(1000, "bfloat16") == "preferred"   # 1000 = 8 * 125 but not 64 * k
    assert check_dim(1001, "bfloat16") == "min"
    assert check_dim(1024, "bfloat16") is None
    assert check_dim(1002, "float32") is None           # IEEE fp32 runs on CUDA cores: no tensor-core rule
    assert check_dim(1002, "tf32") == "min"
    assert check_dim(1000, "float8_e4m3fn") == "min"     # fp8 needs 16 elements


def test_tp_split_breaks_alignment():
    # The serving case from the issue: FFN 18,432 split 32 ways = 576, not a multiple of 128 fp8 elements.
    found = tp_split_findings({"ffn": 18432}, "float8_e4m3fn", tp_degrees=(8, 32))
    assert [(f["tp"], f["split"], f["severity"]) for f in found] == [(32, 576, "preferred")]
    assert "576" in found[0]["reason"]
    bad = tp_split_findings({"ffn": 11008}, "bfloat16", tp_degrees=(8, 3))
    assert {f["tp"] for f in bad} == {8, 3}   # 1376 misses 64; 11008 does not divide by 3


def test_alignment_findings_flag_misaligned_dims_only():
    df = gemm_frame(shapes=((4096, 4096, 4096), (4096, 1000, 4096), (4096, 4096, 1001), (1001, 4096, 4096)))
    f = alignment_findings(df)
    got = sorted((r["dim"], r["value"], r["severity"]) for r in f.iter_rows(named=True))
    assert got == [("k", 1001, "min"), ("n", 1000, "preferred")]
    assert f.filter(f["dim"] == "k")["ranks"].to_list()[0] == [0, 1, 2, 3]
    assert "16-byte minimum" in f.filter(f["dim"] == "k")["reason"][0]


def test_alignment_findings_tp_names_unsplit_size():
    f = alignment_findings(gemm_frame(shapes=((4096, 1000, 4096),)), tp=4)
    assert "unsplit 4x: 4000" in f["reason"][0]


def test_alignment_config_validation():
    with pytest.raises(ConfigError):
        AlignmentConfig(min_bytes=16, preferred_bytes=100)
    with pytest.raises(ConfigError):
        AlignmentConfig(dims=("x",))
    with pytest.raises(ConfigError):
        AlignmentConfig(min_gemm_dim=0)
    # M (rows, usually tokens) is never the contiguous dim of a row-major GEMM: checked only when asked.
    assert alignment_findings(gemm_frame(shapes=((1000, 4096, 4096),))).height == 0
    assert alignment_findings(gemm_frame(shapes=((1000, 4096, 4096),)), AlignmentConfig(by_layout=False)).height
    assert alignment_findings(gemm_frame(shapes=((1000, 4096, 4096),)).with_columns(layout=pl.lit("tn"))).height


def test_only_contiguous_dims_by_layout():
    # A weight gradient dW^T[K_in, N] = X^T @ dY reduces over tokens (k=1001): no operand is contiguous in it.
    wgrad = gemm_frame(shapes=((4096, 4096, 1001),)).with_columns(layout=pl.lit("tn"))
    assert alignment_findings(wgrad).height == 0
    fwd = gemm_frame(shapes=((4096, 4096, 1001),)).with_columns(layout=pl.lit("nt"))
    assert alignment_findings(fwd)["dim"].to_list() == ["k"]


@pytest.mark.parametrize("shape,dtype", [((2, 1, 2048), "bfloat16"), ((2048, 1, 32), "bfloat16"),
                                         ((2048, 125, 320), "float32"), ((2048, 1953, 1024), "float32")])
def test_no_alignment_finding_where_alignment_does_not_matter(shape, dtype):
    # The HTA sample's shapes: GEMV-like GEMMs with a dim of 1 or 2, and IEEE fp32 (no tensor cores).
    assert alignment_findings(gemm_frame(shapes=(shape,), dtype=dtype)).height == 0
    assert alignment_findings(gemm_frame(shapes=((2048, 1001, 4096),), dtype=dtype)).height == (dtype != "float32")


def test_kernel_classes_table():
    names = ["ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", "aten::mm", "aten::addmm",
             "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cutlass_80_tensorop_s1688gemm_128x64_align1",
             "void at::native::vectorized_elementwise_kernel<4>", "flash_fwd_kernel", "Memcpy HtoD"]
    assert classify(names).to_list() == ["gemm_cublas", "gemm_aten", "gemm_aten", "nccl", "gemm_cutlass",
                                         "elementwise", "flash_attention", "memcpy"]
    assert class_of("something unheard of") == "other"


def test_kernel_traits_parse_layout_alignment_and_tile():
    import polars as pl

    from rankscope.analysis.kernels.classes import kernel_traits

    df = kernel_traits(pl.DataFrame({"name": ["cutlass_80_tensorop_bf16_s16816gemm_bf16_128x256_32x3_tn_align1",
                                              "ampere_sgemm_64x64_nn", "aten::mm"]}))
    assert df["name_layout"].to_list() == ["tn", "nn", None]
    assert df["name_align"].to_list() == [1, None, None]
    assert df["name_tile"].to_list() == ["128x256", "64x64", None]


def test_gemm_rows_without_shapes_are_the_full_paths_empty_frame():
    """Records without GEMM shapes (OSDI'25 traces) skip the name patterns: same columns and types as the full
    path gives on no rows, and a fresh frame per call."""
    from rankscope.analysis.kernels.alignment import _gemms_of, gemm_rows

    shaped = gemm_frame()
    for unshaped in (shaped.with_columns(pl.lit(None, dtype=pl.Int64).alias("m")),
                     shaped.with_columns(pl.when(pl.col("rank") >= 0).then(None).otherwise(pl.col("k")).alias("k"))):
        full = _gemms_of(unshaped.head(0))
        first, second = gemm_rows(unshaped), gemm_rows(unshaped)
        assert first.height == 0 and first.schema == full.schema and first.equals(full)
        assert first is not second
    assert gemm_rows(shaped).height == shaped.height
