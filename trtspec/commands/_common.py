"""Helpers shared by the CLI verbs: turning expected failures into clear messages, not tracebacks."""

from __future__ import annotations

import functools
from typing import Any, Callable

import click
from rich.console import Console

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)


class UserError(click.ClickException):
    """An expected failure with a message for the user (exit code 1, no traceback)."""

    def show(self, file: Any = None) -> None:  # noqa: ARG002 - click's signature
        err_console.print(f"[bold red]error:[/] {self.message}", markup=True, highlight=False, soft_wrap=True)  # paths stay whole when copied


def friendly_errors(*error_types: type[BaseException]) -> Callable:
    """Turn the listed exception types into UserError, so users see the message and not a traceback."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except error_types as e:  # type: ignore[misc]
                raise UserError(str(e)) from None

        return inner

    return wrap


