"""Parallel dimensions from the names a job gives its process groups: the job's own statement.

Megatron-LM names every group it creates (``pg_config`` desc in flight-recorder dumps and in Kineto's
``distributedInfo``): ``TENSOR_MODEL_PARALLEL_GROUP``, ``PIPELINE_MODEL_PARALLEL_GROUP``,
``DATA_PARALLEL_GROUP[_WITH_CP]``, ``CONTEXT_PARALLEL_GROUP``, ``EXPERT_MODEL_PARALLEL_GROUP``,
``EXPERT_DATA_PARALLEL_GROUP``, ... torch's DeviceMesh (torchtitan) names a mesh dimension's group
``mesh_<dim>`` (``mesh_tp``, ``mesh_pp``, ``mesh_dp_shard``, ...). Groups that span several dimensions
(``MODEL_PARALLEL_GROUP``, ``TENSOR_AND_DATA_PARALLEL_GROUP``, the embedding group, ``default_pg``) name no
single one and are not read. A name is read only when its groups form one family: disjoint, of one size.

The named dimensions replace what the collectives suggested; the report says which dimension came from
names and which from the collectives, and lists where the two disagree (:func:`with_group_names`).
"""

from __future__ import annotations

import re
from dataclasses import replace

from rankscope.analysis.report.strategy import NameConflict, Strategy
from rankscope.analysis.strategy.whitebox import PRODUCT_NOTE_START

NAME_TABLE: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), d) for p, d in (
    # Megatron-LM (parallel_state); the full name must match, so combined groups are left out
    (r"TENSOR_MODEL_PARALLEL_GROUP", "tp"),
    (r"PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
    (r"DATA_PARALLEL_GROUP", "dp"),
    (r"DATA_PARALLEL_GROUP_WITH_CP", "dp_cp"),
    (r"CONTEXT_PARALLEL_GROUP", "cp"),
    (r"TENSOR_AND_CONTEXT_PARALLEL_GROUP", "tp_cp"),
    (r"EXPERT_MODEL_PARALLEL_GROUP", "ep"),
    (r"EXPERT_DATA_PARALLEL_GROUP", "expert_dp"),
    # torch DeviceMesh groups, ``mesh_<dim name>`` (torchtitan's dim names)
    (r"mesh_tp", "tp"),
    (r"mesh_pp", "pp"),
    (r"mesh_cp", "cp"),
    (r"mesh_ep", "ep"),
    (r"mesh_dp", "dp"),
    (r"mesh_dp_replicate", "dp_replicate"),
    (r"mesh_dp_shard", "dp_shard"),
    (r"mesh_dp_(?:shard_)?cp", "dp_cp"),
))
"""(full-match pattern of a process group's desc, the dimension its groups are)"""

REPORTED = ("dp", "pp", "tp", "cp", "ep", "expert_dp")


def _dimension(desc: str) -> str | None:
    # Megatron suffixes a group's desc with nothing; some dumps carry "<desc>,<n>" (NVRx's tables): cut it
    name = desc.split(",")[0].strip()
    for pattern, dim in NAME_TABLE:
        if pattern.fullmatch(name):
            return dim
    return None


def named_families(named_groups: list[dict]) -> dict[str, dict]:
    """{dimension: {groups, size, desc}} for each dimension whose named groups form one family.

    Needs ``named_groups`` as :attr:`JobFrames.named_groups` ({desc, ranks}). A dimension whose groups
    overlap or differ in size is left out (the name does not describe one parallel dimension there).
    """
    by_dim: dict[str, dict] = {}
    for g in named_groups:
        dim = _dimension(g["desc"])
        if dim is None:
            continue
        d = by_dim.setdefault(dim, {"groups": set(), "desc": g["desc"].split(",")[0].strip()})
        d["groups"].add(tuple(sorted(g["ranks"])))
    out = {}
    for dim, d in by_dim.items():
        groups = sorted(d["groups"])
        members = [m for g in groups for m in g]
        sizes = {len(g) for g in groups}
        if len(sizes) == 1 and len(members) == len(set(members)):
            out[dim] = {"groups": [list(g) for g in groups], "size": sizes.pop(), "desc": d["desc"]}
    return _derived(out)


def _derived(fam: dict[str, dict]) -> dict[str, dict]:
    """dp and cp from the combined names where the plain ones are absent.

    cp = |TENSOR_AND_CONTEXT| / tp without a CONTEXT group; dp = |DATA_WITH_CP| / cp (its groups are dp's
    when cp is 1) without a DATA group; torch's HSDP dp = replicate x shard.
    """
    if "cp" not in fam and "tp_cp" in fam and "tp" in fam and fam["tp_cp"]["size"] % fam["tp"]["size"] == 0:
        cp = fam["tp_cp"]["size"] // fam["tp"]["size"]
        fam["cp"] = {"groups": None, "size": cp,
                     "desc": f"{fam['tp_cp']['desc']} / {fam['tp']['desc']}"}
    if "dp" not in fam and "dp_cp" in fam and "cp" in fam and fam["dp_cp"]["size"] % fam["cp"]["size"] == 0:
        cp = fam["cp"]["size"]
        fam["dp"] = {"groups": fam["dp_cp"]["groups"] if cp == 1 else None,
                     "size": fam["dp_cp"]["size"] // cp, "desc": fam["dp_cp"]["desc"]}
    if "dp" not in fam and "dp_shard" in fam:
        rep = fam.get("dp_replicate", {"size": 1, "desc": ""})
        fam["dp"] = {"groups": fam["dp_shard"]["groups"] if rep["size"] == 1 else None,
                     "size": fam["dp_shard"]["size"] * rep["size"],
                     "desc": " x ".join(d for d in (rep["desc"], fam["dp_shard"]["desc"]) if d)}
    return {k: v for k, v in fam.items() if k in REPORTED}


def _groups_of(s: Strategy, dim: str) -> list[list] | None:
    return {"dp": s.dp_groups, "pp": s.pp_groups, "tp": s.tp_groups, "ep": s.ep_groups,
            "cp": s.whitebox.cp_groups if s.whitebox else None}.get(dim)


def _same_groups(seen: list[list] | None, named: list[list] | None) -> bool | None:
    """Whether the collectives' groups are among the named ones (singletons aside; dumps of a few calls
    show only some groups); None when either is unknown."""
    if not seen or not named:
        return None
    return {frozenset(g) for g in seen if len(g) > 1} <= {frozenset(g) for g in named}


def with_group_names(white: Strategy, named_groups: list[dict]) -> Strategy:
    """The white-box strategy with each dimension the job names taken from its names.

    Needs ``named_groups`` as :attr:`JobFrames.named_groups`. Returns ``white`` unchanged without a named
    dimension; otherwise its degrees and groups for the named dimensions, ``dimension_sources`` (per
    degree: ``names: <desc>`` or ``collectives``), the conflicts between the two readings, and the
    undecided entries the names settle removed.
    """
    fam = named_families(named_groups)
    if not fam or not white.evaluated:
        return white
    changes: dict = {}
    conflicts: list[NameConflict] = []
    ranks = sorted({m for g in white.pp_groups for m in g} | {m for f in fam.values() for g in f["groups"] or []
                                                                for m in g})
    for dim, f in sorted(fam.items()):
        before, before_groups = getattr(white, dim, None), _groups_of(white, dim)
        same = _same_groups(before_groups, f["groups"])
        if (before is not None and before != f["size"]) or same is False:
            conflicts.append(NameConflict(field=dim, desc=f["desc"], names=f["size"], collectives=before,
                                          names_groups=f["groups"], collectives_groups=before_groups))
        changes[dim] = f["size"]
        groups = _full_groups(f["groups"], ranks)
        if dim == "pp" and same:
            groups = None  # the collectives' pipelines are the same sets, in stage order: keep them
        if groups is not None and dim in ("dp", "pp", "tp", "ep"):
            changes[f"{dim}_groups"] = groups
    sources = {d: (f"names: {fam[d]['desc']}" if d in fam else "collectives") for d in REPORTED
               if d in fam or getattr(white, d, None) is not None}
    decided = set(fam) | {f"{d}_groups" for d in fam}
    notes = [*(white.notes or []), f"{', '.join(sorted(fam))} from the job's process-group names"]
    out = replace(white, **changes, dimension_sources=sources, name_conflicts=conflicts,
                  undecided=[u for u in white.undecided if u.field not in decided])
    dims = {d: getattr(out, d) for d in ("dp", "pp", "tp")}
    if all(d in fam for d in ("dp", "pp", "tp")) and (
            dims["dp"] * dims["pp"] * dims["tp"] * (out.cp or 1) == out.world_size):
        # the job's own names tile every rank: as sure as the records themselves, and the collectives'
        # product that did not tile them is no longer the report's
        notes = [n for n in notes if not n.startswith(PRODUCT_NOTE_START)]
        out = replace(out, confidence=max(out.confidence, 0.95))
    return replace(out, notes=notes)


def _full_groups(groups: list[list] | None, ranks: list[int]) -> list[list] | None:
    """Named groups plus a singleton for each rank they leave out (a degree's groups cover every rank)."""
    if groups is None:
        return None
    covered = {m for g in groups for m in g}
    return sorted(groups) + [[r] for r in ranks if r not in covered]
