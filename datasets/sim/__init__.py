"""The simulated job: its config, topology, schedule, per-stage ops, op graph and records."""
