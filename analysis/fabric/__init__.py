"""A shared fabric's flow records into pair traffic, a link graph, a grid fit and recognised jobs."""

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.recognise import FabricJobs, RecognisedJob, job_flows, recognise_jobs

__all__ = ["FabricJobs", "FlowConfig", "RecognisedJob", "job_flows", "recognise_jobs"]
