"""The step model: a program's device and host time on a profile (pricing), a partitioning's
step from its programs, communication and bubble (model), and the pipeline runner's host time
(pipelinehost)."""
