"""What a job is doing, on top of the API layer: status, wait, follow rank 0, explain a
failure, doctor. ``explain.py`` is pure (API dicts in, words out); the rest call the cluster.
"""
