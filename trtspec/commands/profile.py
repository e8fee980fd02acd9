"""`trtspec profile` (placeholder until its issue lands)."""

import click

from trtspec.commands._common import not_implemented


@click.command("profile")
def command() -> None:
    """Not implemented yet."""
    not_implemented("profile", "see the open issues")
