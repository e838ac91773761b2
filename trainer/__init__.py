"""ddpjob's DDP trainer: ``python -m trainer [--config FILE.yaml] [key=value ...]``.

Modules, in the order a run uses them:

- ``__main__``     CLI, exit codes, re-launch under torchrun in a Kubeflow pod that needs it
- ``config``       TrainConfig (pydantic, no torch): the one schema of a run
- ``distributed``  the launcher's env -> rank/device/process group; small collective helpers
- ``tasks/``       the Task protocol, built-in ``vision`` and ``lm``, loading ``pkg.mod:factory``
- ``loader``       sharded, resumable micro-batch stream (DistributedSampler, drop_last)
- ``optim``        AdamW + warmup/cosine schedule
- ``rng``          per-rank seeding and RNG state capture
- ``checkpoint``   atomic writes, keep-last-k, resume past a torn file
- ``metrics``      rank 0's JSON-lines events, tqdm, NVML, TensorBoard
- ``train``        the Trainer: build the parts, run the loop
"""
