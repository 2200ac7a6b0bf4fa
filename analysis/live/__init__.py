"""Live diagnosis: each completed window of a running job's steps analysed as analyze does, state carried over (pure; the caller reads the store)."""

from rankscope.analysis.live.flows import LiveCapture, LiveFlowConfig
from rankscope.analysis.live.windows import DEFAULT_HANG_TIMEOUT_S, LIVE_KINDS, LiveConfig, LiveJob

__all__ = ["DEFAULT_HANG_TIMEOUT_S", "LIVE_KINDS", "LiveCapture", "LiveConfig", "LiveFlowConfig", "LiveJob"]
