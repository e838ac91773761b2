"""The Kubernetes API layer: the only code that imports the ``kubernetes`` client.

``client.py`` (a connection, its calls, the one error translation), ``watch.py`` (a watch that
resumes and re-lists), ``logstream.py`` (a followed container log). Errors carry data (status,
reason), never advice for the user.
"""
