"""looptpl: render a readable, distributed-ready training loop that you own."""

__version__ = "0.1.0"
