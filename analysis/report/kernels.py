"""The report's ``regressions``: GEMMs slower than their peers or a baseline, or misaligned for tensor cores."""

from __future__ import annotations

from typing import Any

from rankscope.analysis.report.codec import doc
from rankscope.collectors.record_class import record


@record
class ThroughputCheck:
    """A GEMM shape whose measured throughput is below the threshold against other ranks or a baseline."""

    check: str = doc("throughput.")
    kernel: str = doc("the kernel name.")
    kernels: list[str] = doc("every kernel name of this shape.")
    kernel_class: str = doc("the kernel class (kernels.classes).")
    shape: list[int] = doc("[batch,] m, n, k.")
    dtype: str = doc("the element type.")
    layout: str | None = doc("the operand layout (nn, nt, tn, tt) where the name tells it.")
    ranks: list[int] = doc("the ranks it is slow on.")
    ratio: float = doc("achieved / expected throughput.")
    ratio_basis: str = doc("what it is compared with: other ranks or the baseline.")
    tflops: float | None = doc("its throughput, TFLOP/s.")
    reference_tflops: float | None = doc("the throughput it is compared with.")
    reason: str = doc("why it is slow, in words.")
    severity: str = doc("regression.")
    comparison: str = doc("ranks or baseline.")


@record
class AlignmentCheck:
    """A GEMM shape whose dims break the dtype's tensor-core alignment rule."""

    check: str = doc("alignment.")
    kernel: str = doc("the kernel name.")
    kernel_class: str = doc("the kernel class.")
    shape: list[int] = doc("[batch,] m, n, k.")
    dtype: str = doc("the element type.")
    layout: str | None = doc("the operand layout where known.")
    ranks: list[int] = doc("the ranks that ran it.")
    ratio: float = doc("its TFLOP/s over the job's aligned GEMMs of its class and size (1.0 with no basis).")
    ratio_basis: str = doc("what the ratio is against, or none.")
    reason: str = doc("which dims break which rule.")
    severity: str = doc("min (below the 16-byte minimum) or preferred (below 128 bytes).")
    dims: list[str] = doc("the misaligned dims.")
    comparison: str = doc("rules.")


KernelCheck = ThroughputCheck | AlignmentCheck


@record
class Regression:
    """One kernel regression: the check that found it and the finding it makes."""

    check: KernelCheck = doc("what was measured.", flatten=True)
    kind: str = doc("misaligned_gemm or kernel_regression.")
    culprit: int | list | str = doc("the rank when one rank is slow, the ranks when several are slow on "
                                    "nearly every shape, else the kernel.")
    factor: float | None = doc("how many times slower (1 / ratio).")
    steps: list[int] = doc("the steps it ran in.")
    evidence: dict[str, Any] = doc("the measured numbers.")

    @property
    def ratio(self) -> float:
        return self.check.ratio

    @property
    def reason(self) -> str:
        return self.check.reason
