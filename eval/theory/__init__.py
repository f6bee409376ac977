"""Theory: ParallelBench's ideal analytic model and the accuracy curves it predicts."""
