"""Where the `dbq` commands print (rich, on stdout)."""

from rich.console import Console

console = Console()
