"""The loop's parts: the optimizer step, the log window, evaluation, the stop decisions, the
optimizer and its schedule, the data loader and the seeds."""
