"""The step's critical path across ranks, read off the what-if dependency graph; imports whatif, never the reverse.

A step's path is the chain of binding dependencies that ends at its last op (:mod:`.path`); its shares by rank,
stage, op class and link and every rank's slack (:mod:`.shares`); the edits that would shorten it, each replayed
(:mod:`.edits`); the report section (:mod:`.section`). A graph with a template (OSDI'25) is replayed over it
(:mod:`.template`), others with the wave plan.
"""

from rankscope.analysis.critical_path.path import StepPaths, path_delays, step_paths
from rankscope.analysis.critical_path.section import critical_path_section, path_of_graph, section_of_graph

__all__ = ["StepPaths", "critical_path_section", "path_delays", "path_of_graph", "section_of_graph", "step_paths"]
