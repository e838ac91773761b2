"""ddpjob's controller: job spec, PyTorchJob rendering, cluster client and CLI."""
