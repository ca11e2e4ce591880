"""`python -m dbq.cli`: the `dbq` command."""

from dbq.cli import main

main()
