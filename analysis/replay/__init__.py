"""The graph replay engine shared with the simulator; knows no jobs, only ops, edges and sync groups."""

from rankscope.analysis.replay.engine import CycleError, replay

__all__ = ["CycleError", "replay"]
