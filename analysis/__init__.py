"""Job recognition, strategy, timelines, what-if, regressions, hangs and the report: pure functions over the record kinds (no file I/O, printing or plotting but in runner/)."""
