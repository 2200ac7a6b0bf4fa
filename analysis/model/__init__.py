"""One job on one clock, built once: aligned frames, layout, steps, timelines, data quality."""
