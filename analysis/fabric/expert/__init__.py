"""Expert parallelism in the fabric: all-to-all meshes inside DP groups, set apart before the DP x PP grid is fit."""

from rankscope.analysis.fabric.expert.mesh import ExpertSplit, split_expert_links

__all__ = ["ExpertSplit", "split_expert_links"]
