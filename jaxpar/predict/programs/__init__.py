"""The programs a partitioning runs, compiled for a profile's target (gputarget: XLA:GPU's own
programs without a GPU) and read into what one partitioning costs (workload)."""
