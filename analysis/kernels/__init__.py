"""The regression section: GEMM alignment and throughput against peers or a baseline."""
