"""The graph replay engine shared with the simulator; knows no jobs, only ops, edges and sync groups."""
