"""Point-to-point calls on two real gloo ranks (torchrun), hooked through the explicit API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.torchjob

SCRIPT = '''
import json, sys, torch, torch.distributed as dist
from rankscope.collectors import hooks
hooks.enable(store=sys.argv[1], job="p2p", watchdog=False, flush_interval_s=60)
dist.init_process_group("gloo")
r = dist.get_rank(); other = 1 - r
a, b = torch.full((3,), float(r)), torch.empty(3)
if r == 0:
    dist.send(a, 1)                                   # send 12 B
    src = dist.recv(torch.empty(5, dtype=torch.float64))  # recv from any source
    dist.send_object_list([{"k": 1}], dst=1)
else:
    dist.recv(b, 0)
    dist.send(torch.ones(5, dtype=torch.float64), 0)  # 40 B
    objs = [None]; dist.recv_object_list(objs, src=0)
ops = [dist.P2POp(dist.isend, a, other), dist.P2POp(dist.irecv, b, other)]
for w in dist.batch_isend_irecv(ops):
    w.wait()
reqs = [dist.isend(torch.ones(2, dtype=torch.int64), other), dist.irecv(torch.empty(2, dtype=torch.int64), other)]
for w in reqs:
    w.wait()
rep = hooks.disable()
json.dump({"received": b.tolist(), "report": rep}, open(sys.argv[2] + f"/r{r}.json", "w"))
dist.destroy_process_group()
'''


def test_p2p_rows_on_two_ranks(tmp_path):
    script = tmp_path / "p2p.py"
    script.write_text(SCRIPT)
    bin_dir = Path(sys.executable).parent
    r = subprocess.run([str(bin_dir / "torchrun"), "--standalone", "--nproc_per_node=2", str(script),
                        str(tmp_path / "st"), str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    from rankscope.collectors.store import Store

    ops = Store(tmp_path / "st").read("comm_op", job="p2p").sort("rank", "start_ns")
    got = {rank: [(o["op"], o["peer"], o["size_bytes"], o["dtype"], o["seq"])
                  for o in ops.filter(ops["rank"] == rank).to_dicts()] for rank in (0, 1)}
    assert got[0] == [("send", 1, 12, "float32", 0), ("recv", 1, 40, "float64", 0), ("send", 1, None, None, 1),
                      ("send", 1, 12, "float32", 2), ("recv", 1, 12, "float32", 1),
                      ("send", 1, 16, "int64", 3), ("recv", 1, 16, "int64", 2)]
    assert got[1] == [("recv", 0, 12, "float32", 0), ("send", 0, 40, "float64", 0), ("recv", 0, None, None, 1),
                      ("send", 0, 12, "float32", 1), ("recv", 0, 12, "float32", 2),
                      ("send", 0, 16, "int64", 2), ("recv", 0, 16, "int64", 3)]
    for rank in (0, 1):
        rep = json.loads((tmp_path / f"r{rank}.json").read_text())["report"]
        assert rep["lost_total"] == 0 and rep["written"]["comm_op"] == 7
