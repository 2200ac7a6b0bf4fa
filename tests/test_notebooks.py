"""The worked examples in notebooks/: each .ipynb is paired with a jupytext percent .py (the two hold the
same cells) and runs top to bottom without an error, reading the reference data in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import SHARED

nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
NEEDS_SHARED = {"02_flows_to_strategy", "03_whatif_osdi25"}
NEEDS_TORCH = {"01_kineto_to_verdict"}

pytestmark = pytest.mark.slow


def _sources(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_every_notebook_has_its_paired_script():
    assert len(NOTEBOOKS) >= 3
    for path in NOTEBOOKS:
        script = path.with_suffix(".py")
        assert script.is_file(), f"{path.name} has no paired {script.name}"
        nb = nbformat.read(path, as_version=4)
        paired = jupytext.read(script)
        assert _sources(nb) == _sources(paired), f"{path.name} and {script.name} differ: run jupytext --sync"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
    if path.stem in NEEDS_SHARED and not SHARED.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path.name} needs {SHARED}")
        pytest.skip(f"{SHARED} not found")
    if path.stem in NEEDS_TORCH:
        pytest.importorskip("torch.distributed")
    nb = nbformat.read(path, as_version=4)
    os.environ.setdefault("RANKSCOPE_SHARED", str(SHARED))
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
