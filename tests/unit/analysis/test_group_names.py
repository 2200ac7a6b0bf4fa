from rankscope.analysis.report.strategy import Strategy
from rankscope.analysis.strategy.group_names import named_families, with_group_names


def _g(desc, *groups):
    return [{"desc": desc, "ranks": list(g)} for g in groups]


def test_megatron_names_map_to_dimensions_and_combined_groups_are_not_read():
    named = (_g("TENSOR_MODEL_PARALLEL_GROUP", (0, 1), (2, 3)) + _g("DATA_PARALLEL_GROUP_WITH_CP", (0, 2), (1, 3))
             + _g("TENSOR_AND_CONTEXT_PARALLEL_GROUP", (0, 1), (2, 3)) + _g("MODEL_PARALLEL_GROUP", (0, 1, 2, 3))
             + _g("TENSOR_AND_DATA_PARALLEL_GROUP", (0, 1, 2, 3)) + _g("default_pg", (0, 1, 2, 3)))
    fam = named_families(named)
    assert sorted(fam) == ["cp", "dp", "tp"]
    assert (fam["tp"]["size"], fam["cp"]["size"], fam["dp"]["size"]) == (2, 1, 2)
    assert fam["dp"]["groups"] == [[0, 2], [1, 3]]


def test_context_parallel_splits_the_data_parallel_with_cp_degree():
    named = (_g("TENSOR_MODEL_PARALLEL_GROUP", *[(i,) for i in range(8)]) + _g("CONTEXT_PARALLEL_GROUP", (0, 1), (2, 3),
                                                                              (4, 5), (6, 7))
             + _g("DATA_PARALLEL_GROUP_WITH_CP", (0, 1, 2, 3), (4, 5, 6, 7)))
    fam = named_families(named)
    assert fam["cp"]["size"] == 2 and fam["dp"]["size"] == 2 and fam["dp"]["groups"] is None


def test_device_mesh_names_and_overlapping_groups():
    fam = named_families(_g("mesh_tp", (0, 1), (2, 3)) + _g("mesh_dp_replicate", (0, 2)) + _g("mesh_dp_shard", (0,), (2,))
                         + _g("mesh_pp", (0, 1, 2), (2, 3)))
    assert fam["tp"]["size"] == 2 and "pp" not in fam  # pp's groups overlap: not one family
    assert fam["dp"]["size"] == 2


def test_names_replace_the_collectives_reading_and_say_where_they_disagree():
    white = Strategy(world_size=4, dp=1, pp=1, tp=4, dp_groups=[[r] for r in range(4)], pp_groups=[[r] for r in range(4)],
                     tp_groups=[[0, 1, 2, 3]], confidence=0.5, method="comm_op",
                     notes=["dp*pp*tp*cp = 4 but 4 ranks"])
    named = (_g("TENSOR_MODEL_PARALLEL_GROUP", (0, 1), (2, 3)) + _g("DATA_PARALLEL_GROUP", (0, 2), (1, 3))
             + _g("PIPELINE_MODEL_PARALLEL_GROUP", *[(r,) for r in range(4)]))
    out = with_group_names(white, named)
    assert (out.dp, out.pp, out.tp) == (2, 1, 2) and out.tp_groups == [[0, 1], [2, 3]]
    assert out.dimension_sources == {"dp": "names: DATA_PARALLEL_GROUP", "pp": "names: PIPELINE_MODEL_PARALLEL_GROUP",
                                     "tp": "names: TENSOR_MODEL_PARALLEL_GROUP"}
    assert sorted((c.field, c.names, c.collectives) for c in out.name_conflicts) == [("dp", 2, 1), ("tp", 2, 4)]
    assert out.confidence >= 0.95
    assert with_group_names(white, _g("undefined", (0, 1))) is white


def test_nccl_calls_name_their_groups_in_kineto():
    from rankscope.collectors.importers.kineto.comm_rows import named_groups

    args = [{"Process Group Description": "mesh_tp", "Process Group Ranks": "[0, 1]"},
            {"Process Group Description": "mesh_tp", "Process Group Ranks": "[0, 1]"},
            {"Process Group Description": "undefined", "Process Group Ranks": "[0, 2]"},
            {"Process Group Name": "3"}]
    assert named_groups(args) == [{"desc": "mesh_tp", "ranks": [0, 1]}]
    assert named_families(named_groups(args))["tp"]["size"] == 2
