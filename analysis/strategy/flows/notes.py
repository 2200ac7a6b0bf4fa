"""The sentences the flows strategy shows the user: the one place its prose lives.

The algorithm (strategy.flows.infer, strategy.flows.steps) decides when a note applies and which numbers
it carries; each function here takes those numbers and returns the sentence, so the wording can be read
and edited in one place, apart from the logic. The golden reports compare these sentences byte for byte.
"""

from __future__ import annotations


def no_training_flows() -> str:
    """Why neither a strategy nor steps were inferred: no record looked like training traffic."""
    return "no training flows"


def datagram_timing(resolution_ns: int) -> str:
    """Packet samples carry their datagram's time, ``resolution_ns`` coarse: short lags order nothing."""
    return (f"packet samples timed by the datagrams that carried them: a sample's time may be up to "
            f"{resolution_ns / 1e6:.0f} ms late, so lags shorter than that tell nothing of which came first")


def pipeline_links_undated(links: int) -> str:
    """``links`` TCP pipeline links whose records span the steps: their first and last times do not vote."""
    return (f"{links} TCP pipeline link(s) kept their records open across steps: their first and last "
            "records date the connections' set-up and teardown, not the first activations and last "
            "gradients, and do not vote on the stage order")


def pipeline_links_end_dated(links: int) -> str:
    """Follows :func:`pipeline_links_undated`: ``links`` of those links still date their last gradients."""
    return (f"... but {links} of them closed with a FIN or RST in a record of its own, after their "
            "last payload record (TCP flags): that record ends with the last gradients, and votes")


def sampled_capture(links: int, lightest_samples: int, all_seen_chance: float) -> str:
    """A sampled capture of ``links`` links whose lightest got ``lightest_samples`` samples: the chance
    ``all_seen_chance`` that no link went unseen scales the confidence."""
    return (f"sampled capture: the lightest of the job's {links} links was seen in "
            f"{lightest_samples} sampled packet(s); a link as light goes unseen often enough that "
            f"all its links were seen with a chance of {all_seen_chance:.2f}, "
            "and the confidence is scaled by it")


def stage_order_unknown() -> str:
    """No pipeline link voted on the direction: the report lists the pipelines one way and claims none."""
    return ("stage order unknown: no pipeline link shows which direction started first "
            "(over TCP or with ACK flows both open together), and address order is no evidence; "
            "the pipelines are listed all in one direction, which may be last stage to first: "
            "the direction is not reported and the confidence does not cover it")


def wrap_unknown() -> str:
    """Follows :func:`stage_order_unknown` for cyclic pipelines whose wrap link nothing shows."""
    return ("the pipelines close into cycles (an interleaved schedule's last stage sends back "
            "to its first) and nothing shows where they wrap: which stage is first is unknown "
            "too; the confidence covers each pipeline's members and their neighbours round it")


def equal_labellings(labellings: int) -> str:
    """``labellings`` labellings explain the traffic alike and no evidence broke the tie."""
    return (f"{labellings} labellings fit the traffic (almost) equally well and no "
            "evidence prefers the one reported: the confidence is split between them")


def undecided_stage_order() -> str:
    """Why the report's ``undecided`` lists the pipelines' direction."""
    return ("no pipeline link shows which direction started first: the pipelines may run as listed or "
            "reversed")


def undecided_tie(labellings: int) -> str:
    """Why the report's ``undecided`` lists the groups (and the degrees, when the labellings differ in them)."""
    return (f"{labellings} labellings fit the traffic (almost) equally well and no evidence prefers one: "
            "the candidates list each labelling's DP groups")


def undecided_tp() -> str:
    """Why the report's ``undecided`` lists tp (flows never see the links inside a host)."""
    return ("tensor-parallel peers talk inside a host, which no switch sees, and the counts of connections do "
            "not tell how many ranks share an address")


def too_few_step_records() -> str:
    """Why no steps: fewer than three records of the periodic traffic."""
    return "too few flow records to find steps"


def no_periodic_traffic() -> str:
    """Why no steps: the bursts of data-parallel traffic do not repeat at any period."""
    return "no periodic data-parallel traffic"


def timeouts_set_record_starts(median_record_ns: float, bursts_per_flow: float,
                               continued_share: float) -> str:
    """Why no steps: the exporter's timeouts, not the job, cut the records (``continued_share`` of them
    continue their flow's previous one, a flow shows ``bursts_per_flow`` burst starts)."""
    return (f"no periodic traffic seen: records last {median_record_ns / 1e6:.0f} ms (median), a flow shows "
            f"{bursts_per_flow:.1f} burst starts and {continued_share:.0%} of the records continue "
            "their flow's previous one: the exporter's timeouts, not the job's steps, set where records "
            "start, so the step time cannot be read from them")


def period_below_resolution(period_ns: float, resolution_ns: int) -> str:
    """Why no steps: the period seen is under two ticks of the records' clock (datagram cadence)."""
    return (f"the traffic seems to repeat every {period_ns / 1e6:.1f} ms, under two ticks of the "
            f"records' time resolution ({resolution_ns / 1e6:.1f} ms): no step time can be read at that "
            "resolution")


def one_period_for_all_steps() -> str:
    """What flow-based boundaries are: one period, repeated."""
    return "flows give one period for all steps; boundaries are spaced by it"


def period_from_burst_spacing() -> str:
    """The phase-coherence period was replaced by the spacing of consecutive bursts."""
    return "replaced by the median spacing of consecutive bursts over whole periods"


def period_weak() -> str:
    """Doubt: the job's traffic repeats only faintly at the period."""
    return "the job's traffic does not repeat clearly at this period: the step time is uncertain"


def period_seen_once() -> str:
    """Doubt: the capture is shorter than two periods."""
    return ("the capture holds this period fewer than twice: nothing confirms it, and it may "
            "be a whole multiple or fraction of the step")


def period_multiple_unconfirmed(multiple: int) -> str:
    """Doubt: the traffic repeats better at ``multiple`` periods, over too few repeats to tell."""
    return (f"the job's traffic repeats better every {multiple} periods, but the capture holds that "
            "too few times to tell it from noise: the step time may be this period or that multiple")


def period_fraction(fraction: int) -> str:
    """Doubt: the traffic repeats as well at 1/``fraction`` of the period."""
    return (f"the job's traffic repeats as well at 1/{fraction} of this period: the step time "
            "may be a whole fraction of it")


def timer_records_hide_bursts(timer_share: float, timer_ns: float, coverage: float) -> str:
    """Doubt: ``timer_share`` of the records were closed by an active timeout of ``timer_ns`` and cover
    ``coverage`` of the time between bursts, so bursts inside them are not seen."""
    return (f"{timer_share:.0%} of the flow records were closed by the exporter's active timeout "
            f"(~{timer_ns / 1e6:.0f} ms) and they cover {coverage:.0%} of the time "
            "between the bursts seen: bursts that start inside a record are not seen, so the step "
            "time may be a whole fraction of this")


def records_span_the_period(cover: float) -> str:
    """Doubt: records last up to ``cover`` of the period, so one may hold several steps."""
    return (f"flow records last up to {cover:.0%} of the period: the exporter's "
            "active timeout may hide steps, so the step time may be a whole fraction of this")


def expert_parallel(ep_groups: list[list[str]], expert_dp_groups: list[list[str]]) -> list[str]:
    """The all-to-all meshes found inside the DP groups (expert parallelism), and the expert rings."""
    if not ep_groups:
        return []
    out = (f"expert parallelism: {len(ep_groups)} full mesh(es) of {len(ep_groups[0])} members (all-to-all "
           "every microbatch, payload both ways) inside the DP groups")
    if expert_dp_groups:
        out += (f"; expert gradients reduced over {len(expert_dp_groups)} expert-data-parallel ring(s) of "
                f"{len(expert_dp_groups[0])}")
    return [out]
