"""What leaves the process: rank 0's JSON-lines events and human lines, TensorBoard, NVML
readings, and Kubeflow Trainer's progress API."""
