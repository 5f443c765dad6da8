"""A byte-level causal language model trained on Python's own standard library"""
