"""The regression section: GEMM alignment and throughput against peers or a baseline."""

from rankscope.analysis.kernels.regressions import RegressionConfig, kernel_regressions, regression_section
from rankscope.analysis.kernels.throughput import ThroughputConfig

__all__ = ["RegressionConfig", "ThroughputConfig", "kernel_regressions", "regression_section"]
