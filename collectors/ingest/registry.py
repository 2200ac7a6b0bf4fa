"""The registry of input formats that ``rankscope ingest`` understands, in auto-detection order.

Importers are listed by dotted name and imported lazily, so the ground floor stays light (no importer's
dependencies load until it is needed). Order matters for auto-detection: the first importer whose ``sniff``
says yes wins, so specific formats come before generic ones. What an importer is:
:mod:`rankscope.collectors.importers.contract`.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from rankscope.collectors.errors import UsageError
from rankscope.collectors.importers.contract import read_head

IMPORTERS: dict[str, str] = {
    # name -> "module:attribute" (attribute is the importer object)
    "whatif_parquet": "rankscope.collectors.importers.osdi_whatif:WHATIF_PARQUET",
    "nccl_profiler": "rankscope.collectors.importers.nccl_profiler:NCCL_PROFILER",
    "kineto": "rankscope.collectors.importers.kineto.importer:KINETO",
    "flight_recorder": "rankscope.collectors.importers.flight_recorder:FLIGHT_RECORDER",
    "nccl_inspector": "rankscope.collectors.importers.nccl_inspector:NCCL_INSPECTOR",
    "nsys_sqlite": "rankscope.collectors.importers.nsys_sqlite:NSYS_SQLITE",
    "ipfix_file": "rankscope.collectors.flows.flow_importers:IPFIX_FILE",
    "netflow9_file": "rankscope.collectors.flows.flow_importers:NETFLOW9_FILE",
    "flow_pcap": "rankscope.collectors.flows.flow_importers:FLOW_PCAP",
    "nfdump_csv": "rankscope.collectors.flows.flow_importers:NFDUMP_CSV",
    "nfdump_json": "rankscope.collectors.flows.flow_importers:NFDUMP_JSON",
    "store-parquet": "rankscope.collectors.importers.tables:PARQUET",
    "csv": "rankscope.collectors.importers.tables:CSV",
}
"""Every format, in auto-detection order. Later issues add theirs before the generic ones."""

GENERIC_LAST = ("store-parquet", "csv")

WITH_COMPANIONS = ("whatif_parquet",)
"""The importers that read other files along with their own (a ``companion`` method: the OSDI'25 trace's
``meta-X.yaml``); the only ones :func:`is_companion` asks. Asking every importer loaded all thirteen and
their libraries (sqlite3, orjson, the Kineto and flow decoders) to list the files of one OSDI'25 trace:
~8 ms CPU of ``analyze --ingest``. An importer that adds a ``companion`` method is listed here (a test
checks it)."""


def importer(name: str):
    try:
        target = IMPORTERS[name]
    except KeyError:
        raise UsageError(f"unknown format {name!r}; expected auto or one of {sorted(IMPORTERS)}") from None
    mod, attr = target.split(":")
    return getattr(importlib.import_module(mod), attr)


def names() -> list[str]:
    return list(IMPORTERS)


def detection_order() -> list[str]:
    specific = [n for n in IMPORTERS if n not in GENERIC_LAST]
    return specific + [n for n in GENERIC_LAST if n in IMPORTERS]


def is_companion(path: Path) -> bool:
    """True when some importer reads this file as part of another (e.g. meta-X.yaml)."""
    return any(importer(n).companion(path) for n in WITH_COMPANIONS)


def detect(path: Path) -> str | None:
    """The name of the first importer that recognises the file, or None."""
    head = read_head(path)
    for n in detection_order():
        if importer(n).sniff(path, head):
            return n
    return None
