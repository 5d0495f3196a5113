"""`python -m epi` runs the CLI."""

from epi.cli import main

main()
