"""Expected traffic of a declared job: groups from the rank order, bytes from the collectives' arithmetic."""

import pytest

from rankscope.analysis.network.declared import declared_strategy, declared_traffic
from rankscope.collectors.errors import ConfigError


def test_megatron_order_groups_and_ring_bytes():
    s, _ = declared_strategy({"tp": 2, "pp": 2, "dp": 2, "rank_order": "tp-pp-dp"})
    assert s.pp_groups == [["0", "2"], ["1", "3"], ["4", "6"], ["5", "7"]]
    assert s.dp_groups == [["0", "4"], ["1", "5"], ["2", "6"], ["3", "7"]]
    rows = declared_traffic({"tp": 2, "pp": 2, "dp": 4, "microbatches": 8, "activation_bytes": 10,
                             "gradient_bytes": 1000, "rank_order": "tp-dp-pp"})
    by = {(r["src"], r["dst"], r["class"]): r["bytes_per_step"] for r in rows}
    # tp-dp-pp: DP peers adjacent after TP; ring of 4: 2*3/4 of the buffer per link
    assert by[("0", "2", "dp")] == pytest.approx(1500) and by[("6", "0", "dp")] == pytest.approx(1500)
    assert by[("0", "8", "pp_activation")] == 80 and by[("8", "0", "pp_gradient")] == 80


def test_interleaved_wrap_fsdp_and_ep():
    rows = declared_traffic({"pp": 4, "dp": 4, "ep": 2, "microbatches": 4, "virtual_stages": 2,
                             "activation_bytes": 1, "gradient_bytes": 400, "data_parallel": "fsdp",
                             "expert_bytes": 1, "moe_layers": 3, "expert_gradient_bytes": 100,
                             "rank_order": "tp-pp-dp", "endpoints": [f"n{i}" for i in range(16)]})
    by = {(r["src"], r["dst"], r["class"]): r["bytes_per_step"] for r in rows}
    assert by[("n0", "n1", "pp_activation")] == 8  # 2 chunks x 4 microbatches
    assert by[("n3", "n0", "pp_wrap")] == 4 and by[("n0", "n3", "pp_wrap")] == 4
    assert by[("n0", "n4", "dp")] == pytest.approx(3 * 3 / 4 * 400)
    assert by[("n0", "n4", "ep")] == 4 * 3 * 2 * 2  # EP pairs are consecutive DP ranks
    assert by[("n0", "n8", "expert_dp")] == pytest.approx(100)  # expert-DP of 2: both ways, 2*1/2
    assert ("n0", "n8", "ep") not in by


def test_bad_config_is_named():
    with pytest.raises(ConfigError, match="ep = 3 does not divide dp = 4"):
        declared_traffic({"dp": 4, "ep": 3})
    with pytest.raises(ConfigError, match="unknown key"):
        declared_traffic({"dp": 2, "bogus": 1})
    with pytest.raises(ConfigError, match="3 endpoints for a world of 4"):
        declared_traffic({"dp": 4, "endpoints": ["a", "b", "c"]})


def test_expect_command_writes_the_csv(tmp_path):
    from rankscope.cli.main import main

    cfg = tmp_path / "job.yaml"
    cfg.write_text("tp: 8\npp: 2\ndp: 2\nmicrobatches: 4\nactivation_bytes: 5.0e7\ngradient_bytes: 1.1e9\n")
    out = tmp_path / "e.csv"
    assert main(["expect", "--config", str(cfg), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "src,dst,class,bytes_per_step" and len(lines) == 1 + 32 + 16 + 16
    assert "0,16,dp,1100000000.0" in lines and "0,8,pp_activation,200000000.0" in lines
    cfg.write_text("dp: 2\ngradient_bytes: lots\n")
    assert main(["expect", "--config", str(cfg)]) == 2
