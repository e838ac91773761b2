"""Pure renderers: a validated spec in, plain dicts out. No clock, no randomness, no API.

``job.py`` (the job of a spec, by its ``api:``), ``pytorchjob.py`` (Kubeflow training operator
v1), ``trainjob.py`` (Kubeflow Trainer v2), ``pod.py`` (the pod both APIs carry),
``args.py`` (trainer settings -> container args), ``values.py`` (Helm chart values),
``values_schema.py`` (their JSON Schema, from the spec's), ``output.py`` (YAML/JSON text).
"""
