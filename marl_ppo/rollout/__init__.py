"""Rollouts: the collector (the only loop that steps envs and acts), rollout workers, and the buffer."""
