"""``python -m milarun`` runs the CLI (the launcher starts children this way)."""

from .cli import main

main(process_entry=True)
