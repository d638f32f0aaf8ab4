"""VMAS: every copy in one batched torch simulator, read and written as tensors on the training device."""
