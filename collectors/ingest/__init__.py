"""Files into the store: the format registry, detection, parallel decode and the ingest itself."""
