"""`trtspec bench` (placeholder until its issue lands)."""

import click

from trtspec.commands._common import not_implemented


@click.command("bench")
def command() -> None:
    """Not implemented yet."""
    not_implemented("bench", "see the open issues")
