"""Rollouts: the stepping loop (`stepper.Stepper`, which every acting caller drives), the collector and
rollout workers built on it, and the buffer."""
