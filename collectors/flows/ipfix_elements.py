"""The IPFIX information elements (IANA registry) that rankscope reads.

Only elements that end in a flow or interface_counter column, or that carry
time bases and sampling, are listed; every other element (including all
enterprise-specific ones) is skipped by its length. NetFlow v9 field type
numbers coincide with these IPFIX element ids for every entry here, and the
fixed NetFlow v5 record is described with the same ids.
"""

from __future__ import annotations

# Decoding kinds: "u" unsigned integer (any length 1-8, reduced-size encoding
# allowed), "ipv4" / "ipv6" addresses, "ntp" the 64-bit NTP timestamp format of
# dateTimeMicroseconds / dateTimeNanoseconds.
ELEMENTS: dict[int, tuple[str, str]] = {
    1: ("octetDeltaCount", "u"),
    2: ("packetDeltaCount", "u"),
    4: ("protocolIdentifier", "u"),
    5: ("ipClassOfService", "u"),
    6: ("tcpControlBits", "u"),
    7: ("sourceTransportPort", "u"),
    8: ("sourceIPv4Address", "ipv4"),
    10: ("ingressInterface", "u"),
    11: ("destinationTransportPort", "u"),
    12: ("destinationIPv4Address", "ipv4"),
    14: ("egressInterface", "u"),
    21: ("flowEndSysUpTime", "u"),
    22: ("flowStartSysUpTime", "u"),
    23: ("postOctetDeltaCount", "u"),
    24: ("postPacketDeltaCount", "u"),
    27: ("sourceIPv6Address", "ipv6"),
    28: ("destinationIPv6Address", "ipv6"),
    34: ("samplingInterval", "u"),
    48: ("samplerId", "u"),
    50: ("samplerRandomInterval", "u"),
    58: ("vlanId", "u"),
    85: ("octetTotalCount", "u"),
    86: ("packetTotalCount", "u"),
    150: ("flowStartSeconds", "u"),
    151: ("flowEndSeconds", "u"),
    152: ("flowStartMilliseconds", "u"),
    153: ("flowEndMilliseconds", "u"),
    154: ("flowStartMicroseconds", "ntp"),
    155: ("flowEndMicroseconds", "ntp"),
    156: ("flowStartNanoseconds", "ntp"),
    157: ("flowEndNanoseconds", "ntp"),
    158: ("flowStartDeltaMicroseconds", "u"),
    159: ("flowEndDeltaMicroseconds", "u"),
    160: ("systemInitTimeMilliseconds", "u"),
    243: ("dot1qVlanId", "u"),
    302: ("selectorId", "u"),
    305: ("samplingPacketInterval", "u"),
    306: ("samplingPacketSpace", "u"),
}
"""element id -> (IANA name, decoding kind)."""

# Which element ids feed which flow column, in order of preference.
SRC_V4, DST_V4, SRC_V6, DST_V6 = 8, 12, 27, 28
OCTETS = (1, 85, 23)
PACKETS = (2, 86, 24)
START_TIMES = (156, 154, 152, 150, 22, 158)
END_TIMES = (157, 155, 153, 151, 21, 159)
VLAN = (58, 243)
SAMPLING = (34, 50, 305)
SELECTOR = (302, 48)
SYSTEM_INIT_MS = 160

NOT_DECODED = frozenset({5})
"""Listed for reference but not read into any column (skipped like unknown elements)."""

NTP_UNIX_OFFSET_S = 2_208_988_800
"""Seconds from the NTP era (1900) to the Unix epoch (RFC 7011 section 6.1.9)."""


def kind_of(element_id: int) -> str | None:
    entry = ELEMENTS.get(element_id)
    return entry[1] if entry else None
