"""rankscope.collectors: record schemas, the trace store, live hooks, flow decoders and importers.

The ground floor: imports no other rankscope package, and importing it pulls in
neither torch nor dash nor ray (a test keeps it so).
"""
