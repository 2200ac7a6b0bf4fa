"""What the wire and the switches see of a simulated job: traffic, transport, flow export, noise."""
