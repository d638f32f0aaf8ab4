"""Competitive training: opponent pools and leagues, ratings of policies, exploitability."""
