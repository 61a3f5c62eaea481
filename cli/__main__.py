"""`python -m tidelog.cli`: the same as the `tide` console script."""

from tidelog.cli import main

main()
