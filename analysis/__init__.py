"""rankscope.analysis: job recognition, strategy, timelines, what-if, regressions, hangs, the report.

Pure functions over the record kinds' frames; no file I/O, printing or plotting.
"""
