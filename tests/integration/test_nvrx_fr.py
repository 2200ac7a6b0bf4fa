"""NVIDIA Resiliency Extension's flight-recorder dumps of a real 16-rank Megatron MoE job (tests/data/nvrx_fr).

Four hangs with faults injected on two ranks; every dumped entry is ``scheduled`` (unfinished calls only) and
some ranks have none. NVRx's own analyzer lists, per scenario, the collectives' process groups that wait and
the ranks missing from them (``reference.txt``). rankscope's root-cause hangs, run through ``analyze --ingest
DIR --job J``, name the same groups and ranks. The reference table lists collectives only (it leaves out
send/recv); so does the comparison.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankscope.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data" / "nvrx_fr"
SCENARIOS = ["gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd"]
P2P = {"send", "recv", "send/recv"}


def reference_table(scenario: str) -> dict[str, list[int]]:
    """{PGID: missing ranks} from NVRx's table (``PGID | desc | op | size | dtype | missing``)."""
    out = {}
    for line in (DATA / scenario / "reference.txt").read_text().splitlines()[1:]:
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 6 and cells[0].isdigit():
            out[cells[0]] = sorted(int(r) for r in cells[5].split(","))
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """scenario -> (report of job 'moe', the analyze run's exit code), analysed once per module."""
    out = {}
    for s in SCENARIOS:
        work = tmp_path_factory.mktemp(s)
        rc = main(["analyze", "--ingest", str(DATA / s), "--job", "moe", "--store", str(work / "st"),
                   "--out-dir", str(work / "out"), "--no-html"])
        names = sorted(p.name for p in (work / "out").glob("*.json"))
        out[s] = (json.loads((work / "out" / "moe.json").read_text()) if names == ["moe.json"] else None, rc, names)
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_analyze_ingest_names_the_job_for_both_steps(reports, scenario):
    report, rc, names = reports[scenario]
    assert rc == 0 and names == ["moe.json"], (rc, names)
    assert report["job"] == "moe"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_root_hangs_equal_nvrx_reference_table(reports, scenario):
    report, _, _ = reports[scenario]
    got: dict[str, set[int]] = {}
    for h in report["hangs"]:
        if h["root_cause"] and h["op"] not in P2P:
            got.setdefault(str(h["group"]), set()).update(h["missing"])
    assert {g: sorted(m) for g, m in got.items()} == reference_table(scenario)
    # the ranks that wait on the missing ones are named, and every rank had a dump: none is absent input
    roots = [h for h in report["hangs"] if h["root_cause"] and h["op"] not in P2P]
    assert all(h["waiting"] and not h["missing_input"] for h in roots)
    assert report["data_quality"]["missing_ranks"] == []


def test_two_ranks_with_identical_empty_dumps_are_two_sources(tmp_path):
    # lock_gil_1st: ranks 9 and 14 had no unfinished call; their dumps decode to the same (no) rows
    from rankscope.collectors.ingest.files import ingest
    from rankscope.collectors.store import Store

    store = Store(tmp_path / "st")
    summary = ingest(store, [DATA / "lock_gil_1st"])
    assert summary.count("ingested") == 16 and summary.count("skipped") == 0
    ranks = sorted(m.notes.get("rank") for m in store.manifest())
    assert ranks == list(range(16))
    # the same files again are the same sources: nothing is added
    again = ingest(store, [DATA / "lock_gil_1st"])
    assert again.count("ingested") == 0 and again.count("skipped") == 16


def test_identical_bytes_under_two_ranks_names_are_both_counted(tmp_path):
    from rankscope.collectors.ingest.files import ingest
    from rankscope.collectors.store import Store

    src = (DATA / "lock_gil_1st" / "_dump_9").read_bytes()
    for r in (3, 5):
        (tmp_path / f"_dump_{r}").write_bytes(src)
    summary = ingest(Store(tmp_path / "st"), [tmp_path / "_dump_3", tmp_path / "_dump_5"])
    assert summary.count("ingested") == 2


# What each scenario's pg_config names (rank 0's dump, every rank's agrees): two of the four runs are TP4 PP2
# (gpu_error_2nd, lock_gil_1st: TENSOR_MODEL_PARALLEL_GROUP [0, 1, 2, 3], PIPELINE_MODEL_PARALLEL_GROUP [0, 8],
# EXPERT_MODEL_PARALLEL_GROUP [0..7]), the other two TP2 PP4.
LAYOUT = {"gpu_error_1st": (2, 4, 2, 4), "gpu_error_2nd": (2, 2, 4, 8),
          "lock_gil_1st": (2, 2, 4, 8), "lock_gil_2nd": (2, 4, 2, 4)}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_strategy_from_the_groups_the_job_names(reports, scenario):
    st = reports[scenario][0]["strategy"]
    dp, pp, tp, ep = LAYOUT[scenario]
    assert (st["dp"], st["pp"], st["tp"], st["ep"], st["cp"], st["expert_dp"]) == (dp, pp, tp, ep, 1, 1)
    for dim, name in (("tp", "TENSOR_MODEL_PARALLEL_GROUP"), ("pp", "PIPELINE_MODEL_PARALLEL_GROUP"),
                      ("dp", "DATA_PARALLEL_GROUP_WITH_CP"), ("ep", "EXPERT_MODEL_PARALLEL_GROUP")):
        assert st["dimension_sources"][dim] == f"names: {name}"
    assert [0, 1, 2, 3][:tp] in st["tp_groups"] and len(st["tp_groups"]) == 16 // tp
    assert sorted(len(g) for g in st["pp_groups"]) == [pp] * (16 // pp)
    assert sorted(len(g) for g in st["dp_groups"]) == [dp] * (16 // dp)
    # the collectives of a dump of a few unfinished calls show no pure data-parallel group: their only
    # once-a-step reduction runs over TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP (tp x dp ranks, the EP groups'
    # members), which timing alone takes for DP. Where names and collectives disagree, it is said, not hidden
    named = {"dp": dp, "pp": pp, "tp": tp, "ep": ep}
    conflicts = {c["field"]: (c["names"], c["collectives"]) for c in st["name_conflicts"]}
    assert "dp" in conflicts, st["name_conflicts"]
    assert all(n == named[f] and c != n for f, (n, c) in conflicts.items()), conflicts
    assert st["confidence"] >= 0.95 and not st.get("undecided")
