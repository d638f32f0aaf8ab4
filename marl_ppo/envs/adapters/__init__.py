"""Adapters: one env copy (PettingZoo parallel or AEC, Gymnasium) read and written as per-group arrays.

`contract` holds the checks every adapter applies to what an env returns.
"""
