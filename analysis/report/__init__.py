"""The report's types and vocabulary: what a diagnosis says. Imports nothing else from rankscope.analysis."""

from rankscope.analysis.report.codec import to_json
from rankscope.analysis.report.data_quality import DataQuality
from rankscope.analysis.report.diagnosis import Diagnosis, WindowEvent
from rankscope.analysis.report.findings import Finding, describe, where
from rankscope.analysis.report.hangs import Hang
from rankscope.analysis.report.kernels import Regression
from rankscope.analysis.report.steps import CriticalPath, Steps
from rankscope.analysis.report.stragglers import Heatmap, Stragglers
from rankscope.analysis.report.strategy import Strategy, Undecided, degree_text
from rankscope.analysis.report.summary import summary_text

__all__ = ["CriticalPath", "DataQuality", "Diagnosis", "Finding", "Hang", "Heatmap", "Regression", "Steps",
           "Strategy", "Stragglers", "Undecided", "WindowEvent", "degree_text", "describe", "summary_text", "to_json",
           "where"]
