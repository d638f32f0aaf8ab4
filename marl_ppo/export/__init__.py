"""Trained policies out of the run: ONNX and TorchScript files, and a policy for inference without a run."""
