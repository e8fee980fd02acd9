"""Helpers shared by the CLI verbs: turning expected failures into clear messages, not tracebacks."""

from __future__ import annotations

import functools
from typing import Any, Callable

import click
from rich.console import Console, ConsoleDimensions

#: the width of output that is no terminal (a file, a pipe, a CI log): rich would take 80 there and cut a wide
#: table's columns to "tok…"; wider than any table, so tables print whole ($COLUMNS still wins where set)
OFF_TERMINAL_WIDTH = 1000


class _Console(Console):
    """A rich Console that prints whole lines and tables where no terminal has a width to fit them to."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        if self._width is None and not self.is_terminal and "COLUMNS" not in self._environ:
            return ConsoleDimensions(OFF_TERMINAL_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


console = _Console(stderr=False, highlight=False)
err_console = _Console(stderr=True, highlight=False)


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


