"""The golden cases: fixed inputs whose report JSON is kept under ``tests/golden/reports/<case>/``.

Each case names the files to ingest (read in place: ../shared, tests/data, the bundled samples) or the
store to analyse, and the CLI options of `analyze`. ``regenerate.py`` writes the reports; the test
rebuilds them the same way and compares field by field (``compare.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("RANKSCOPE_SHARED", REPO.parent / "shared"))
OSDI = SHARED / "reference" / "stragglers-osdi25"
HTA_REF = SHARED / "reference" / "kineto-hta"
VALIDATION = SHARED / "validation" / "flows"
DATA = REPO / "tests" / "data"
GOLDEN = REPO / "tests" / "golden" / "reports"


@dataclass(frozen=True)
class Case:
    name: str
    inputs: tuple[Path, ...] = ()
    """files or folders that `rankscope ingest` reads into a fresh store (under job ``ingest_job``)."""
    ingest_job: str | None = None
    store: Path | None = None
    """a store to analyse as it is (copied first: analyze writes its cache into the store)."""
    simulate: tuple[str, ...] = ()
    """`rankscope simulate` arguments (``--out`` added) whose store is analysed."""
    analyze: tuple[str, ...] = field(default=())
    shared: bool = False
    """reads ../shared (skipped locally without it, failed in CI)."""


def _validation_cases() -> list[Case]:
    out = []
    for case in ("V1-128-pp4-dp4", "V2-256-dp-first-zero", "V3-128-pure-pp", "V4-256-pure-dp",
                 "V5-384-slowlink", "V6-512-twojobs-sampled", "V7-256-moe"):
        out.append(Case(f"validation-{case[:2]}", (VALIDATION / case / "flows.ipfix",), "cap", shared=True))
    out.append(Case("validation-V8", (VALIDATION / "V8-128-slowgpu-v9" / "flows.pcap",), "cap", shared=True))
    return out


def _netns_cases() -> list[Case]:
    files = sorted((DATA / "netns_gloo").glob("*.flows.parquet")) + sorted((DATA / "netns_gloo").glob("*.json"))
    return [Case(f"netns-{p.name.split('.')[0]}", (p,), "fabric") for p in files if p.name != "truth.json"]


CASES: list[Case] = [
    *(Case(f"osdi-{x}", (OSDI / f"trace-{x}.parquet", OSDI / f"meta-{x}.yaml"), x, shared=True)
      for x in ("AR", "ST", "SE")),
    Case("hta-reference", (HTA_REF,), "hta", shared=True),
    *(Case(f"hta-{p.name.split('.')[0]}", (p,), "hta") for p in sorted((DATA / "hta").glob("*.json.gz"))),
    *_validation_cases(),
    *_netns_cases(),
    Case("goflow2-nf5", (DATA / "goflow2" / "nf5.pcap",), "fabric"),
    # the data packets decode only after the template packet: one store for both
    Case("goflow2-nf9", (DATA / "goflow2" / "nf9-template.pcap", DATA / "goflow2" / "nf9-data.pcap"), "fabric"),
    Case("goflow2-sflow", (DATA / "goflow2" / "sflow.pcap",), "fabric"),
    Case("demo-simulation", simulate=("--dp", "4", "--pp", "2", "--tp", "2", "--gpus-per-host", "2", "--steps", "6",
                                      "--fault", "slow-worker:rank=5,factor=1.5")),
    Case("demo-samples", (REPO / "datasets" / "samples" / "demo",), "demo"),
    # a flows-only job whose one late sender costs under the verdict's bar: named in findings, no verdict
    Case("sim-under-the-bar", simulate=("--dp", "8", "--pp", "2", "--tp", "1", "--gpus-per-host", "1", "--steps", "6",
                                        "--fault", "slow-link:rank=5,factor=3.0")),
    Case("hooked-job", store=DATA / "hooked_dp_pp" / "store"),
    Case("gloo-kineto-dp2pp2tp2", (DATA / "gloo_dp2pp2tp2" / "kineto",), "kineto"),
    # a real TP8 one-step profile (all-reduces inside forward and backward): tp=8, no S from one sample
    Case("gloo-kineto-tp8-one-step", (DATA / "gloo_tp8_one_step" / "kineto",), "kineto"),
    # NVRx's flight-recorder dumps of a 16-rank Megatron MoE hang: two stuck EP groups, strategy by name
    Case("nvrx-fr-lock_gil_2nd", tuple(sorted((DATA / "nvrx_fr" / "lock_gil_2nd").glob("_dump_*"))), "moe"),
]

NO_REPORT = "_no_report.json"
"""the golden output of a case whose analyze exits 2 (nothing to analyse), with its message."""

VOLATILE = ("stragglers.seconds",)
"""fields that measure this run, not the input: left out of the comparison."""


def _cli(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from rankscope.cli.main import main; sys.exit(main())"
    env = {**os.environ, "RANKSCOPE_NO_CACHE": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=900)


def available(case: Case) -> str | None:
    """Why the case cannot run here, or None."""
    for p in (*case.inputs, *([case.store] if case.store else [])):
        if not p.exists():
            return f"{p} not found"
    return None


def build_reports(case: Case, work: Path) -> dict[str, str]:
    """Run the case through the CLI in ``work``: {report file name: JSON text}; ``NO_REPORT`` with the exit
    code and message when analyze finds nothing to analyse."""
    store, out = work / "store", work / "out"
    if case.store is not None:
        shutil.copytree(case.store, store)
    elif case.simulate:
        r = _cli("simulate", "--out", str(store), *case.simulate)
        if r.returncode != 0:
            raise RuntimeError(f"{case.name}: simulate failed: {r.stderr[-2000:]}")
    else:
        args = ["ingest", "--store", str(store), "-q", *map(str, case.inputs)]
        if case.ingest_job:
            args += ["--job", case.ingest_job]
        r = _cli(*args)
        if r.returncode != 0:
            raise RuntimeError(f"{case.name}: ingest failed: {r.stderr[-2000:]}")
    r = _cli("analyze", "--store", str(store), "--out-dir", str(out), "--no-html", *case.analyze)
    if r.returncode == 2:
        # nothing to analyse (no job recognised): the message is the golden output
        msg = r.stderr.strip().replace(str(store), "STORE")  # the one thing of this run in the message
        return {NO_REPORT: json.dumps({"exit": 2, "stderr": msg}, indent=1)}
    if r.returncode != 0:
        raise RuntimeError(f"{case.name}: analyze failed ({r.returncode}): {r.stderr[-2000:]}")
    return {p.name: p.read_text() for p in sorted(out.glob("*.json"))}
