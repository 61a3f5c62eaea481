"""`tide demo`: the main job that `make run` runs (grows into the whole local cluster later)."""

from __future__ import annotations

import click


@click.command()
def demo() -> None:
    """Exercise the embedded default and print a summary."""
    click.echo("tidelog demo: nothing to run yet")
