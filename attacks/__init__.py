"""Inversion attacks on the hidden states a split-inference cloud sees."""
