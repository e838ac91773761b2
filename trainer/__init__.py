"""ddpjob's DDP trainer: ``python -m trainer [--config FILE.yaml] [key=value ...]``."""
