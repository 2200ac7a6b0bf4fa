"""The format registry and the ingest engine: which importers and decoders they load."""

from __future__ import annotations

import subprocess
import sys

from rankscope.collectors.ingest import registry


def test_every_importer_with_companions_is_listed():
    with_companion = [n for n in registry.names() if callable(getattr(registry.importer(n), "companion", None))]
    assert sorted(with_companion) == sorted(registry.WITH_COMPANIONS)


def test_listing_an_osdi_trace_loads_no_other_importer(tmp_path):
    """Asking whether a file is a companion loads only the importers that have companions (not sqlite3,
    orjson, the Kineto and flow decoders of the others)."""
    (tmp_path / "trace-X.parquet").write_bytes(b"PAR1")
    (tmp_path / "meta-X.yaml").write_text("pp_size: 2\n")
    code = ("import sys\nfrom pathlib import Path\nfrom rankscope.collectors.ingest import registry\n"
            f"d = Path({str(tmp_path)!r})\n"
            "assert registry.is_companion(d / 'meta-X.yaml') and not registry.is_companion(d / 'trace-X.parquet')\n"
            "mods = registry.IMPORTERS.values()\n"
            "print(sorted({m.split(':')[0] for m in mods if m.split(':')[0] in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(sorted({registry.IMPORTERS[n].split(":")[0] for n in registry.WITH_COMPANIONS}))


def test_ingest_engine_loads_no_flow_decoder():
    """Every ingest opens a flow-template session; only files with flows load the decoders."""
    code = ("import sys, rankscope.collectors.ingest.files\n"
            "print(sorted(m for m in sys.modules if m.startswith('rankscope.collectors.flows.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['rankscope.collectors.flows.template_state']"
