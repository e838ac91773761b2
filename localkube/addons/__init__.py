"""What runs on top of the control plane and the node: the Kubeflow training operator v1
(``training_operator.py``), Kubeflow Trainer v2 and JobSet (``trainer_v2.py``), Kueue
(``kueue.py``), the S3 server (``s3.py``), Prometheus (``prometheus.py``) and the MLflow
tracking server (``mlflow.py``). Each is upstream's command as a host process, with upstream's
manifests from the tools folder pointed at 127.0.0.1; the servers pods reach listen on the
node's bridge behind a Service name (``gateway.py``)."""
