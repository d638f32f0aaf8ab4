"""Run logging: the run logger and its progress lines, the scalar backends (TensorBoard, CSV) and the
experiment trackers (W&B, MLflow)."""
