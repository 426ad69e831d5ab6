"""Speculative decoding across the split: proposers, token trees and the verifier."""
