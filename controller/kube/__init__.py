"""The Kubernetes API layer: the only code that talks to the API server.

``transport.py`` (a kubeconfig made into a urllib3 pool; the ``kubernetes`` client only for
credential programs), ``client.py`` (the calls ddpjob makes, on raw paths), ``errors.py`` (the
one error translation), ``watch.py`` (a watch that resumes and re-lists), ``logstream.py`` (a
followed container log), ``tally.py`` (the requests ``--debug`` counts). Errors carry data
(status, reason), never advice for the user.
"""
