"""`python -m nphcli` runs the same CLI as the `nph` console script."""

from nphcli.cli import main

main()
