"""The CUDA/NCCL path and the CUPTI kernel collector on a real GPU (skipped without one)."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_nccl_available(),
                                 reason="needs NCCL")]


@pytest.fixture
def nccl_group(tmp_path):
    import torch.distributed as dist

    from rankscope.collectors import hooks

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    assert hooks.enable(store=str(tmp_path), job="gpu", watchdog=False, signals=False, flush_interval_s=60)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield tmp_path
    hooks.disable()
    dist.destroy_process_group()


def test_nccl_calls_are_timed_with_events_without_blocking(nccl_group):
    import torch.distributed as dist

    from rankscope.collectors.hooks.hook_comm import HUB
    from rankscope.collectors.store import Store

    x = torch.ones(1 << 20, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    torch.cuda.synchronize()
    HUB.session.writer.flush(final=True)
    ops = Store(nccl_group).read("comm_op")
    assert ops.height == 4 and set(ops["state"]) == {"completed"}
    assert (ops["end_ns"] >= ops["start_ns"]).all()
    assert ops["launch_ns"].null_count() == 0  # the CPU issue time is kept beside the GPU times
    assert set(ops["size_bytes"]) == {4 << 20}


def test_cupti_kernels_become_compute_ops(nccl_group):
    pytest.importorskip("cupti")
    from rankscope.collectors import hooks
    from rankscope.collectors.store import Store

    a = torch.randn(512, 512, device="cuda")
    for _ in range(5):
        a = a @ a
    torch.cuda.synchronize()
    hooks.disable()
    kernels = Store(nccl_group).read("compute_op")
    assert kernels.height >= 5 and "gemm" in set(kernels["category"])
