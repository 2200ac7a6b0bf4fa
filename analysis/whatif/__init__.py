"""The what-if dependency model of a job and the scenarios replayed on it (OSDI'25)."""

from rankscope.analysis.whatif.build import build_graph, model_graph
from rankscope.analysis.whatif.graph import WhatIfGraph, WhatIfInputError
from rankscope.analysis.whatif.metrics import ideal_durations
from rankscope.analysis.whatif.perfetto import (
           flow_events,
           metadata_events,
           path_track_events,
           perfetto_events,
)

__all__ = ["WhatIfGraph", "WhatIfInputError", "build_graph", "flow_events", "ideal_durations", "metadata_events",
           "model_graph", "path_track_events", "perfetto_events"]
