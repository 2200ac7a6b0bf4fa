"""Option help computed when shown, so a command's module need not import the library to describe itself."""

from __future__ import annotations

from collections.abc import Callable

import click


class LazyHelpOption(click.Option):
    """A click option whose help text comes from ``help_text()``, called only when help is printed."""

    def __init__(self, *args, help_text: Callable[[], str], **kwargs):
        super().__init__(*args, **kwargs)
        self._help_text = help_text

    def get_help_record(self, ctx):
        self.help = self._help_text()
        return super().get_help_record(ctx)
