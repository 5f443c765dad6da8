"""`python -m looptpl` runs the CLI."""

from looptpl.cli import main

main()
