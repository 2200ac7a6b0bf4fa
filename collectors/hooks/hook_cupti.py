"""GPU kernels from CUPTI's activity API (``cupti-python``), as compute_op rows.

Starts only when a CUDA device is present and ``cupti`` imports; otherwise
:func:`start` returns None and nothing else happens. CUPTI hands completed
activity buffers to a callback on its own thread; each kernel becomes a
``("k", {...})`` row in the session's buffer (the writer turns it into a
compute_op row). Kernel timestamps are on CUPTI's clock; one offset to the
wall clock, taken at start, places them on the same clock as the comm_op rows.
GEMM shapes are not joined here (kernel names rarely carry them); the
category comes from the kernel name.
"""

from __future__ import annotations

import logging
import re
import time

log = logging.getLogger("rankscope.hooks")

_CATEGORY = [
    ("gemm", re.compile(r"gemm|cutlass|cublas|matmul|wgmma|xmma|sm\d+_.*_(nn|nt|tn|tt)_", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("reduction", re.compile(r"reduce|softmax|norm", re.I)),
    ("memory", re.compile(r"copy|memcpy|memset|cat|transpose", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|activation|gelu|silu|relu", re.I)),
]


def kernel_category(name: str) -> str:
    """compute_op category of a kernel name (first matching pattern; ``other`` otherwise)."""
    for cat, rx in _CATEGORY:
        if rx.search(name):
            return cat
    return "other"


def kernel_row(activity, offset_ns: int, step: int) -> tuple:
    """One CUPTI kernel activity as a compute_op row tuple for the writer."""
    g = getattr
    return ("k", {
        "name": str(g(activity, "name", "") or "kernel"),
        "category": kernel_category(str(g(activity, "name", "") or "")),
        "start_ns": int(activity.start) + offset_ns,
        "end_ns": int(activity.end) + offset_ns,
        "step": step,
        "stream": g(activity, "stream_id", None),
        "device": g(activity, "device_id", None),
        "grid": f"{g(activity, 'grid_x', 0)},{g(activity, 'grid_y', 0)},{g(activity, 'grid_z', 0)}",
        "block": f"{g(activity, 'block_x', 0)},{g(activity, 'block_y', 0)},{g(activity, 'block_z', 0)}",
    })


class CuptiCollector:
    """Registers CUPTI activity callbacks that feed one session's buffer."""

    def __init__(self, session, cupti_module):
        self.session = session
        self.cupti = cupti_module
        self.offset_ns = time.time_ns() - int(cupti_module.get_timestamp())
        self.kernel_kind = cupti_module.ActivityKind.CONCURRENT_KERNEL

    def start(self) -> None:
        self.cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        self.cupti.activity_enable(self.kernel_kind)

    def stop(self) -> None:
        try:
            self.cupti.activity_flush_all(1)
            self.cupti.activity_disable(self.kernel_kind)
        except Exception:  # noqa: BLE001 - CUPTI may already be torn down at exit
            pass

    @staticmethod
    def _buffer_requested():
        return 8 << 20, 0

    def _buffer_completed(self, activities) -> None:
        s = self.session
        try:
            if not s.active:
                return
            for a in activities:
                if getattr(a, "kind", None) == self.kernel_kind:
                    s.buffer.append(kernel_row(a, self.offset_ns, s.step_no))
        except Exception:  # noqa: BLE001 - runs on CUPTI's thread: never let it raise
            s.internal_error()


def start(session) -> CuptiCollector | None:
    """Start the kernel collector when CUDA and cupti-python are available; None otherwise."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        from cupti import cupti
    except Exception:  # noqa: BLE001 - absent or broken: simply no kernel records
        return None
    try:
        c = CuptiCollector(session, cupti)
        c.start()
        return c
    except Exception as e:  # noqa: BLE001
        log.warning("rankscope hook: CUPTI kernel collection could not start: %s", e)
        return None
