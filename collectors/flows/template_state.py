"""IPFIX / NetFlow v9 template state that outlives one file, kept in the store.

Collectors rotate their files every few minutes while exporters resend
templates on their own schedule, so most data files hold no template; nfcapd
keeps templates across rotations for that reason. rankscope does the same:
during one ``ingest`` command every flow file starts from the templates,
options (sampling rates, system init times) and held data that the files
before it left, and the state is saved in ``<store>/_flow_templates/state.json``
for the next ingest into that store. Data sets that arrive before their
template are held (at most ``FlowDecoder.max_waiting_bytes`` of them) and
decoded, into the file being ingested, when the template comes.

Concurrent ingests into one store each start from the saved state; the last
one to finish writes it (templates are facts about exporters, so either
version decodes the same data).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import tempfile
from pathlib import Path

STATE_DIR = "_flow_templates"
STATE_FILE = "state.json"
VERSION = 1


class TemplateState:
    """The decoder state of one store, as a JSON-able dict (see FlowDecoder.snapshot)."""

    def __init__(self, root: Path | None):
        self.path = root / STATE_DIR / STATE_FILE if root is not None else None
        self.data: dict = {}
        self.problem: str | None = None
        if self.path is not None and self.path.is_file():
            try:
                d = json.loads(self.path.read_text())
                if isinstance(d, dict) and d.get("version") == VERSION:
                    self.data = d
                else:
                    self.problem = f"{self.path}: expected template state version {VERSION}; starting empty"
            except (OSError, ValueError) as e:
                self.problem = f"{self.path}: unreadable template state ({e}); starting empty"

    def save(self) -> None:
        if self.path is None or not self.data:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({**self.data, "version": VERSION}, f)
        os.replace(tmp, self.path)


_CURRENT: contextvars.ContextVar[TemplateState | None] = contextvars.ContextVar("flow_template_state",
                                                                               default=None)


@contextlib.contextmanager
def kept_in(root: Path):
    """Template state shared by the flow files ingested inside this block, saved at its end."""
    state = TemplateState(root)
    token = _CURRENT.set(state)
    try:
        yield state
    finally:
        _CURRENT.reset(token)
        state.save()


def current() -> TemplateState | None:
    return _CURRENT.get()
