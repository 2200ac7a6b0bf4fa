"""The ground floor: record schemas, the store, hooks, flow decoders and importers; imports no other rankscope package, and loads neither torch, dash nor ray (a test keeps it so)."""
