"""Live diagnosis: each completed window of a running job's steps analysed as analyze does, state carried over (pure; the caller reads the store)."""

from rankscope.analysis.live.flows import LiveCapture, LiveFlowConfig
from rankscope.analysis.live.windows import LIVE_KINDS, LiveConfig, LiveJob

__all__ = ["LIVE_KINDS", "LiveCapture", "LiveConfig", "LiveFlowConfig", "LiveJob"]
