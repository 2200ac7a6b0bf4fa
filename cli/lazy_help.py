"""Option help computed when read, so a command's module need not import the library to describe itself."""

from __future__ import annotations

from collections.abc import Callable

import click


class LazyHelpOption(click.Option):
    """A click option whose help text comes from ``help_text()``, called only when the help is read."""

    def __init__(self, *args, help_text: Callable[[], str], **kwargs):
        self._help_text = help_text
        super().__init__(*args, **kwargs)

    @property
    def help(self) -> str:
        return self._help_text()

    @help.setter
    def help(self, _value) -> None:
        # click assigns the constructor's help here; the callable is the only source.
        pass
