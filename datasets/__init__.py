"""rankscope.datasets: the job simulator with ground truth, and small bundled samples."""
