"""The command line. Imports the commands; nothing imports it (``controller.cli.main:main`` is
the entry point of ``python -m controller`` and the ``ddpjob`` script)."""
