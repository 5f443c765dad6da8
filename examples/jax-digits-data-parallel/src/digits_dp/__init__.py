"""A small Flax CNN on scikit-learn's 8x8 handwritten digits"""
