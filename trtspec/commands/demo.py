"""`trtspec demo` (placeholder until its issue lands)."""

import click

from trtspec.commands._common import not_implemented


@click.command("demo")
def command() -> None:
    """Not implemented yet."""
    not_implemented("demo", "see the open issues")
