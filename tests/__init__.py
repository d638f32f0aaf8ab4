"""The tests, by kind: unit/, integration/, envs/ and cli/; helpers.py holds what they share."""
