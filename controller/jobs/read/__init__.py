"""The pure readers of a job: API dicts and log lines in, words and records out. No ``Cluster``,
no clock, no I/O; nothing here imports the modules above it (``tests/test_layout.py``).

``apis`` (the PyTorchJob and TrainJob adapters), ``explain`` (why it failed; reading pods and
events), ``why`` (why it does not run), ``queue`` (where it stands in Kueue), ``loglines``
(timestamps, the cursor that prints a line once), ``trainer_events`` (what the trainer's events
say), ``history`` (what its pods went through) and ``view`` (the job as its watches show it).
"""
