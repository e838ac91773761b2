"""ddpjob's trainer, DDP or FSDP2: ``python -m trainer [--config FILE.yaml] [key=value ...]``.

The house, in the order a run uses it:

- ``__main__``     parses the command line and dispatches: re-launch or train
- ``contract``     torch-free: exit codes, event names and their parser, launcher variables
- ``config``       TrainConfig (pydantic, no torch): the one schema of a run
- ``sizing``       a run's model state per rank, before anything runs (no torch)
- ``launch``       the launcher's environment, and the re-launch under torchrun (no torch)
- ``distributed``  the process group (join, teardown) and the collectives every room uses
- ``tasks/``       the Task protocol, built-in ``vision`` and ``lm``, loading ``pkg.mod:factory``
- ``parts/``       the loop's parts: the strategy (ddp | fsdp), step, window, evaluation, stop,
                   optimizer, loader, seeds
- ``checkpoint/``  stores, the manager (whole or sharded), the broadcast of a resumed state, the
                   save cadence
- ``health/``      the watchdog, stragglers, the goodput ledger
- ``telemetry/``   rank 0's events, TensorBoard, NVML, the TrainJob progress poster
- ``train``        the Trainer: build the parts, run the loop
"""
