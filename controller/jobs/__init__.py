"""What a job is doing, on top of the API layer, in two rooms.

``read/`` is pure: API dicts and log lines in, words and records out, no ``Cluster`` and no I/O
(the job APIs' adapters, why a job waits, why it failed, where it stands in its queue, log lines,
the trainer's events, and :class:`~controller.jobs.read.view.JobView`, the one view of a job's
watch stream). The modules here hold a ``Cluster`` and read through it: ``snapshot`` (one read
of a job, each object fetched once, that a command's readers share), ``watches`` (the view, kept
current), ``wait``, ``follow``, ``status``, ``goodput``, ``rank0``, ``find``, ``queue``,
``doctor``.
"""
