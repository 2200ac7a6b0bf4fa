"""Switch flow records: IPFIX, NetFlow v9/v5 and sFlow v5 decoders, flow files and the UDP collector."""
