"""A fixed-seed fuzz run over every non-flow input format: no traceback, every bad record counted."""

from __future__ import annotations

import os

from tests.unit.collectors.input_fuzz import GENERATORS, run

# A fixed file count (about 60 s here), so every machine fuzzes the same files; the time
# budget only stops a very slow machine early, on a prefix of that same sequence.
FILES = int(os.environ.get("RANKSCOPE_FUZZ_FILES", "1300"))
BUDGET_S = float(os.environ.get("RANKSCOPE_FUZZ_S", "180"))


def test_fuzzed_inputs_never_raise(tmp_path):
    c = run(seed=14, budget_s=BUDGET_S, max_files=FILES, work=tmp_path)
    assert not c.tracebacks, c.tracebacks[:5]
    # every format was exercised, and the corpus really was broken: files failed and records were rejected
    assert set(c.files) == set(GENERATORS) and min(c.files.values()) >= 3, c.files
    statuses = {s for (_, s) in c.outcomes}
    assert {"ingested", "failed"} <= statuses and c.rejected > 0, c.line()
