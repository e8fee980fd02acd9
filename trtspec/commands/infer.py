"""`trtspec infer` (placeholder until its issue lands)."""

import click

from trtspec.commands._common import not_implemented


@click.command("infer")
def command() -> None:
    """Not implemented yet."""
    not_implemented("infer", "see the open issues")
