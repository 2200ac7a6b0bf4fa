"""One job's strategy and steps from its switch flow records alone (black-box)."""
