"""The PyTorch profiler's (Kineto's) Chrome trace JSON into comm_op, compute_op and step_mark."""
