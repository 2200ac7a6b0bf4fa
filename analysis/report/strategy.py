"""The report's ``strategy`` section: the job's parallel groups, from its collectives or its flows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rankscope.analysis.report.codec import doc
from rankscope.collectors.record_class import record


def degree_text(v: int | None) -> str:
    """A parallel degree as reports show it: '?' where the input leaves it undecided (null in the JSON)."""
    return "?" if v is None else str(v)


@record
class Undecided:
    """A strategy field the input leaves open."""

    field: str = doc("the field: dp, pp, tp, ep, stage_order, dp_groups, pp_groups or tp_groups.")
    why: str = doc("what the input lacks to decide it.")
    candidates: list = doc("the values that fit the input equally well, where they are known.", factory=list,
                           omit="empty")


@record
class Labelling:
    """Another DP x PP labelling of the flows that fits the traffic (almost) as well as the one reported."""

    dp: int = doc("its data-parallel degree.")
    pp: int = doc("its pipeline degree.")
    fit: float = doc("its mean per-link fit to the traffic models (0..1).")
    dp_groups: list[list] = doc("its first DP groups (at most four).")


@record
class WhiteboxDetail:
    """What the collective records alone tell (``method`` ``comm_op``)."""

    interleaved: bool = doc("the send/recv graph closes into cycles: an interleaved pipeline schedule.")
    groups_unknown: list[str] = doc("the degrees (dp, tp) whose groups collective streams without a group "
                                    "may hide.")
    cp_groups: list[list] | None = doc("each context-parallel ring's members; null without CP.")


@record
class FlowsDetail:
    """What the flow records tell about their own reading (``method`` ``flows``)."""

    grid_valid: bool = doc("the heavy links split into DP groups that each fit a collective and pipelines "
                           "that carry payload both ways.", True)
    stage_order_agreement: float = doc("how much the links' votes on the stage order agree (0: no vote).", 0.0)
    model_fit: float = doc("the mean per-link fit to the traffic models of the labelling (0..1).", 0.0)
    dp_group_kinds: dict[str, int] | None = doc("collective kind (ring, tree, pair, all_to_all, single) -> number "
                                         "of DP groups that fit it; null when unknown.", None)
    ambiguous: bool = doc("other labellings fit as well and no evidence broke the tie.", False)
    alternatives: list[Labelling] = doc("the other labellings that fit (almost) as well.", factory=list)
    tie_broken: bool = doc("a tie between labellings was broken by the bytes per link.", False)
    tie_evidence: str | None = doc("what broke the tie, or why nothing did.", None)
    stage_order_known: bool = doc("a link voted on the pipelines' direction; without a vote the pipelines "
                                  "are listed in one direction that may be last stage to first.", True)
    wrap_unknown: bool = doc("interleaved pipelines close into cycles and nothing shows where they wrap.", False)
    stage_order_confidence: float | None = doc("chance that the pipelines' direction is right; null without "
                                               "pipelines.", None)
    confidence_evidence: str = doc("what the confidence rests on (unique grid, a k-way tie, a tie broken, "
                                   "an invalid grid, few samples).", "")
    stage_order_dp_votes: dict[str, list] = doc("'i>j' -> the steps' votes of the gradient reductions on which "
                                                "of two stages came first.", factory=dict)
    ranks_per_address: dict[str, Any] = doc("how many ranks share each address, counted from the connections "
                                            "of the heavy pairs, and why.", factory=dict)


@record
class Comparison:
    """The strategy from the collectives against the one from the flows, through the endpoint_map."""

    evaluated: bool = doc("both strategies existed and an endpoint_map related addresses to ranks.")
    why: str | None = doc("why not, when not evaluated.", None, omit="none")
    degrees: dict[str, dict] | None = doc("per degree (dp, pp, tp): white (collectives) and black (flows).",
                                          None, omit="none")
    dp_groups_only_comm_op: list[list] | None = doc("DP groups only the collectives show (as ranks).", None,
                                                    omit="none")
    dp_groups_only_flows: list[list] | None = doc("DP groups only the flows show (as ranks).", None, omit="none")
    pipelines_only_comm_op: list[list] | None = doc("pipelines only the collectives show.", None, omit="none")
    pipelines_only_flows: list[list] | None = doc("pipelines only the flows show.", None, omit="none")
    unmapped_addresses: list[str] | None = doc("flow endpoints the endpoint_map does not name.", None,
                                               omit="none")
    agree: bool | None = doc("degrees (but tp) and groups agree.", None, omit="none")


@record
class NameConflict:
    """A dimension whose process-group names and collectives read differently (the names are reported)."""

    field: str = doc("the degree: dp, pp, tp, cp, ep or expert_dp.")
    desc: str = doc("the name its groups carry (e.g. TENSOR_MODEL_PARALLEL_GROUP).")
    names: int = doc("the degree the names give.")
    collectives: int | None = doc("the degree the collectives gave; null where they left it open.")
    names_groups: list[list] | None = doc("the named groups; null where a name gives the degree only.")
    collectives_groups: list[list] | None = doc("the groups the collectives gave; null where unknown.")


@record
class Strategy:
    """Which endpoints form data-parallel groups and pipelines (in stage order), and the other degrees."""

    world_size: int = doc("number of endpoints (ranks or NIC addresses) seen.", 0)
    dp: int | None = doc("data-parallel degree; null when the input cannot decide it (``undecided`` says why).",
                         1)
    pp: int | None = doc("pipeline degree; null when the input cannot decide it.", 1)
    tp: int | None = doc("tensor-parallel degree; null when it cannot be inferred.", None)
    dp_groups: list[list] = doc("each data-parallel group's members (singletons for a degree of 1).",
                                factory=list)
    pp_groups: list[list] = doc("each pipeline's members, first stage to last.", factory=list)
    confidence: float = doc("chance that every field claimed is right (0..1).", 0.0)
    ep: int | None = doc("expert-parallel degree; null without EP or when it cannot be inferred.", None)
    cp: int | None = doc("context-parallel degree; null without CP.", None)
    tp_groups: list[list] | None = doc("each tensor-parallel group's members; null when unknown.", None)
    ep_groups: list[list] | None = doc("each expert-parallel (all-to-all) group's members; null when there is no "
                                       "expert parallelism or it cannot be inferred.", None)
    method: str | None = doc("what the strategy was read from: comm_op or flows.", None, omit="none")
    evaluated: bool = doc("a strategy was inferred; false with ``why`` when the input holds none.", True)
    why: str | None = doc("why the strategy was not evaluated.", None, omit="none")
    notes: list[str] | None = doc("what the inference noticed on the way, in words.", None, omit="none")
    whitebox: WhiteboxDetail | None = doc("from the collectives: interleaving, unknown groups, EP and CP "
                                          "groups.", None, flatten=True)
    flows: FlowsDetail | None = doc("from the flows: grid validity, ties, stage-order votes.", None,
                                    flatten=True)
    comparison: Comparison | None = doc("collectives against flows, when the job has both.", None, omit="none")
    undecided: list[Undecided] = doc("every field the input leaves open, with why and what fits.",
                                     factory=list, omit="empty")
    expert_dp: int | None = doc("expert data-parallel degree, where the job names its groups; null otherwise.",
                                None, omit="none")
    dimension_sources: dict[str, str] = doc("per degree (dp, pp, tp, cp, ep, expert_dp), where the job names "
                                            "process groups: ``names: <the name>`` (the job's own statement) or "
                                            "``collectives`` (where its calls sit and their timing).",
                                            factory=dict, omit="empty")
    name_conflicts: list[NameConflict] = doc("dimensions whose names and collectives disagree; the names are "
                                             "reported.", factory=list, omit="empty")

    def claimed(self) -> Strategy:
        """The strategy as the report claims it: a degree listed in ``undecided`` is null and its groups are
        not listed (the analyses read the first labelling; the report never guesses one)."""
        open_ = {u.field for u in self.undecided}
        out = self
        if "dp" in open_:
            out = replace(out, dp=None, dp_groups=[])
        if "pp" in open_:
            out = replace(out, pp=None, pp_groups=[])
        return out

    @property
    def stage_order_known(self) -> bool:
        """Whether the pipelines are claimed first stage to last (collectives always order them)."""
        return self.flows.stage_order_known if self.flows is not None else True

    @property
    def interleaved(self) -> bool:
        return bool(self.whitebox and self.whitebox.interleaved)

    @property
    def tied_labellings(self) -> list[Labelling]:
        """The other labellings of a standing tie (none when a tie was broken or there was none)."""
        return list(self.flows.alternatives) if self.flows is not None and self.flows.ambiguous else []


@record
class TrafficPair:
    """One directed endpoint pair: what the strategy implies against what the flows show."""

    src: str = doc("the sending endpoint.")
    dst: str = doc("the receiving endpoint.")
    classes: list[str] = doc("the traffic classes the strategy sends over it (dp, pp_activation, pp_gradient, "
                             "pp_wrap, ep, expert_dp); empty for an unexpected pair.")
    expected: float | None = doc("expected payload bytes per step; null for an unexpected pair.")
    observed: float | None = doc("payload bytes per step the flows show (sampling-scaled); null when none.")
    ratio: float | None = doc("observed / expected; null when either is missing.")
    kind: str = doc("ok, missing (expected, not seen), unexpected (seen, not expected), slow (its rate is below "
                    "its peers'), rerouted (metered at an exporter its leaf does not own) or not_judged (inside a DP "
                    "group whose flows are not its ring, e.g. a tree all-reduce: ``dp_groups_not_ring``).")
    within_error: bool = doc("observed matches expected within the sampling error and its class's own spread "
                             "(a two-sided band, Bonferroni over the job's pairs at 1 %).")
    rate: float | None = doc("payload bytes per second of record time; null without timed records.")
    peer_rate: float | None = doc("the median rate of its peers (same class and stage).")
    rel_error: float = doc("the relative sampling error of the observed bytes (0 unsampled).")
    model_error: float = doc("the relative spread of its class's single-class links (0 where they agree to the "
                             "byte; all-to-all sizes follow the routing).")
    cost_ns: float = doc("what the ranking uses (per ``bytes_per``): for slow, the extra transfer time its bytes "
                         "take at its rate against its peers'; for the other kinds, the time its bytes take at "
                         "the peers' rate. An upper bound of its cost to the step, not that cost: transfers "
                         "overlap each other and compute (the straggler section's what-if gives the step's).")
    exporters: list[str] = doc("the exporters that metered its payload.", factory=list)


@record
class TrafficClass:
    """One traffic class over all its pairs."""

    name: str = doc("dp, pp_activation, pp_gradient, pp_wrap, ep or expert_dp.")
    pairs: int = doc("pairs the strategy sends it over.")
    seen: int = doc("of those, pairs the flows show.")
    within_error: int = doc("of those, pairs whose observed bytes match expected within the sampling error.")
    median_ratio: float | None = doc("median observed / expected.")
    max_deviation: float | None = doc("largest |ratio - 1|.")


@record
class Traffic:
    """Expected traffic from the strategy against the flows, pair by pair, ranked by extra transfer time."""

    evaluated: bool = doc("a strategy with links and flow records were there to compare.")
    why: str | None = doc("why not, when not evaluated.", None, omit="none")
    topology: str | None = doc("where the topology came from: a file, or inferred from the exporters.", None)
    sizing: str = doc("how expected bytes were sized (the strategy gives links, not message sizes).", "")
    bytes_per: str = doc("step, or capture when no steps were found (expected, observed and cost are then per "
                         "capture; the ratios stand).", "step")
    pairs_total: int = doc("expected pairs plus unexpected ones.", 0)
    kinds: dict[str, int] = doc("pairs per kind.", factory=dict)
    classes: list[TrafficClass] = doc("per class, how the pairs compare.", factory=list)
    pairs: list[TrafficPair] = doc("every pair that is not ok, then the costliest ok ones, by ``cost_ns`` "
                                   "(at most ``listed``).", factory=list)
    listed: int = doc("the most pairs listed.", 0)
    slow_not_evaluated: list[str] = doc("the class@stage whose links are too few to call one slow against the "
                                        "others (slow is not evaluated there).", factory=list, omit="empty")
    dp_groups_not_ring: list[int] = doc("indexes (in the strategy's dp_groups) of the DP groups whose flows run "
                                        "between members that are not ring neighbours (a tree all-reduce, or "
                                        "another algorithm): the ring's pairs are no expectation for them, so their "
                                        "pairs are not_judged.", factory=list, omit="empty")


@record
class PlacementClass:
    """Where one traffic class's bytes go in the fabric."""

    name: str = doc("dp, pp_activation, pp_gradient, pp_wrap, ep or expert_dp.")
    bytes_per_step: float = doc("its observed payload bytes per step (``traffic.bytes_per``).")
    in_leaf: float | None = doc("share of those bytes between endpoints of one leaf.")
    across_leaves: float | None = doc("share between leaves of one pod (through a spine).")
    across_pods: float | None = doc("share between pods; null when the topology has no pods.")


@record
class GroupSpan:
    """A group or pipeline whose members sit in more than one pod."""

    kind: str = doc("dp, ep or pipeline.")
    index: int = doc("its index in the strategy's dp_groups, ep_groups or pp_groups.")
    pods: list[str] = doc("the pods its members sit in.")


@record
class PipelineCrossing:
    """A pipeline link between stages in different pods, in stage order."""

    pipeline: int = doc("the pipeline's index in pp_groups.")
    stage: int = doc("the sending stage (the link is stage -> stage + 1).")
    src: str = doc("the endpoint of that stage.")
    dst: str = doc("the endpoint of the next stage.")
    src_pod: str = doc("its pod.")
    dst_pod: str = doc("the next stage's pod.")


@record
class EndpointMove:
    """One endpoint the proposed mapping moves: it takes another endpoint's place (host, leaf, pod)."""

    endpoint: str = doc("the endpoint (its NIC address, or rank).")
    host: str = doc("its host today.")
    proposed_host: str = doc("the host it moves to.")
    takes_place_of: str = doc("the endpoint whose place (the same rail of that host) it takes.")


@record
class PlacementProposal:
    """A better rank-to-host mapping from a local search over the job's own hosts (whole hosts swap: a host
    keeps its GPU count and TP stays inside it), with its crossing shares and the step time the replay of the
    job's transfers predicts for it (the transfers that stop or start crossing pods get the rate the job's own
    in-pod or cross-pod transfers show)."""

    evaluated: bool = doc("a proposal was searched for and replayed.")
    why: str | None = doc("why not: no pods, nothing to gain, or nothing to replay.", None, omit="none")
    method: str | None = doc("how the mapping was searched and the step time predicted.", None)
    moves: list[EndpointMove] = doc("the endpoints that move (today's host and the proposed one).", factory=list)
    hosts_moved: int = doc("hosts whose endpoints move.", 0)
    across_pods_bytes: float | None = doc("bytes per step between pods today (the strategy's links).", None)
    proposed_across_pods_bytes: float | None = doc("bytes per step between pods with the proposal.", None)
    reduction: float | None = doc("share of today's cross-pod bytes the proposal saves.", None)
    classes: list[PlacementClass] = doc("per class, the shares of its bytes with the proposal.", factory=list)
    step_ns: float | None = doc("step time of the job's transfers replayed as they are (span over steps).", None)
    proposed_step_ns: float | None = doc("step time the replay predicts with the proposal.", None)
    gain: float | None = doc("share of the step the proposal saves: 1 - proposed_step_ns / step_ns.", None)
    rate_in_pod: float | None = doc("payload bytes per second of the job's in-pod transfers (measured).", None)
    rate_across_pods: float | None = doc("payload bytes per second of its cross-pod transfers (measured).",
                                         None)
    transfers_changed: int = doc("transfers of the capture whose pod crossing the proposal changes.", 0)


@record
class Placement:
    """How the job's traffic sits in the fabric: per class in a leaf, across leaves, across pods."""

    evaluated: bool = doc("a topology with leaves and the flows' pairs were there.")
    why: str | None = doc("why not, when not evaluated.", None, omit="none")
    topology: str | None = doc("where the topology came from.", None)
    classes: list[PlacementClass] = doc("per class, the shares of its bytes.", factory=list)
    groups_across_pods: list[GroupSpan] = doc("DP and EP groups and pipelines spanning pods (none when the "
                                              "topology has no pods).", factory=list)
    pipeline_links_across_pods: list[PipelineCrossing] = doc("pipeline links crossing pods, by pipeline then "
                                                             "stage.", factory=list)
    unplaced: int = doc("endpoints of the job the topology does not place.", 0)
    proposal: PlacementProposal | None = doc("a better rank-to-host mapping over the job's own hosts, its "
                                             "crossing shares and the step time the replay predicts for it.",
                                             None, omit="none")
