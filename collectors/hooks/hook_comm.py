"""Wrappers around torch.distributed's collective and point-to-point calls.

:func:`patch` replaces each call in ``torch.distributed`` and
``torch.distributed.distributed_c10d`` by a wrapper that times it and appends
one comm_op row to the session's buffer. Argument positions are looked up once
from a table (:data:`SPECS`), so the hot path is a handful of tuple indexings,
two ``time.time_ns()`` and a ``deque.append``. Calls made from inside another
hooked call (``all_gather_object`` runs ``all_gather`` twice) are not recorded
again: a thread-local flag marks that the thread is inside one.

Async calls return a :class:`HookedWork` that stamps completion at ``wait()``.
For CUDA tensors start/end are CUDA events recorded on the current stream
(which the NCCL stream is ordered against at call and at ``wait()``), resolved
to wall time later by the writer thread: the hot path never synchronises.
Nothing here may raise into the job: every step of ours is guarded, and the
job's own exceptions pass through unchanged (recorded as ``failed``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

_tls = threading.local()
_now = time.time_ns


@dataclass(frozen=True)
class OpSpec:
    """Where one torch.distributed function keeps the things a comm_op row needs."""

    op: str
    """Binding op name (schema.COMM_OPS)."""
    tensor: tuple | None = None
    """(position, name) of the input tensor, or of a list of tensors when ``tensor_list``."""
    tensor_list: bool = False
    out: tuple | None = None
    """(position, name) of the output tensor (or list) for out_size_bytes."""
    out_list: bool = False
    group: tuple = (None, "group")
    peer: tuple | None = None
    """(position, global-rank name, group-rank name) of the peer or root."""
    async_arg: tuple | None = None
    """(position, name) of ``async_op``; None: always sync, unless ``always_async``."""
    always_async: bool = False
    is_p2p: bool = False
    obj: bool = False
    """Object collective: payload size is unknown without pickling twice, so it stays null."""


SPECS: dict[str, OpSpec] = {
    "all_reduce": OpSpec("all_reduce", (0, "tensor"), group=(2, "group"), async_arg=(3, "async_op")),
    "all_reduce_coalesced": OpSpec("all_reduce", (0, "tensors"), tensor_list=True, group=(2, "group"),
                                   async_arg=(3, "async_op")),
    "broadcast": OpSpec("broadcast", (0, "tensor"), group=(2, "group"), peer=(1, "src", "group_src"),
                        async_arg=(3, "async_op")),
    "reduce": OpSpec("reduce", (0, "tensor"), group=(3, "group"), peer=(1, "dst", "group_dst"),
                     async_arg=(4, "async_op")),
    "all_gather": OpSpec("all_gather", (1, "tensor"), out=(0, "tensor_list"), out_list=True,
                         group=(2, "group"), async_arg=(3, "async_op")),
    "all_gather_into_tensor": OpSpec("all_gather", (1, "input_tensor"), out=(0, "output_tensor"),
                                     group=(2, "group"), async_arg=(3, "async_op")),
    "all_gather_single": OpSpec("all_gather", (1, "input_tensor"), out=(0, "output_tensor"),
                                group=(2, "group"), async_arg=(3, "async_op")),
    "_all_gather_base": OpSpec("all_gather", (1, "input_tensor"), out=(0, "output_tensor"),
                               group=(2, "group"), async_arg=(3, "async_op")),
    "all_gather_coalesced": OpSpec("all_gather", (1, "input_tensor_list"), tensor_list=True,
                                   group=(2, "group"), async_arg=(3, "async_op")),
    "reduce_scatter": OpSpec("reduce_scatter", (1, "input_list"), tensor_list=True, out=(0, "output"),
                             group=(3, "group"), async_arg=(4, "async_op")),
    "reduce_scatter_tensor": OpSpec("reduce_scatter", (1, "input"), out=(0, "output"),
                                    group=(3, "group"), async_arg=(4, "async_op")),
    "reduce_scatter_single": OpSpec("reduce_scatter", (1, "input"), out=(0, "output"),
                                    group=(3, "group"), async_arg=(4, "async_op")),
    "_reduce_scatter_base": OpSpec("reduce_scatter", (1, "input"), out=(0, "output"),
                                   group=(3, "group"), async_arg=(4, "async_op")),
    "all_to_all_single": OpSpec("all_to_all", (1, "input"), out=(0, "output"),
                                group=(4, "group"), async_arg=(5, "async_op")),
    "all_to_all": OpSpec("all_to_all", (1, "input_tensor_list"), tensor_list=True,
                         out=(0, "output_tensor_list"), out_list=True, group=(2, "group"),
                         async_arg=(3, "async_op")),
    "gather": OpSpec("gather", (0, "tensor"), group=(3, "group"), peer=(2, "dst", "group_dst"),
                     async_arg=(4, "async_op")),
    "scatter": OpSpec("scatter", (0, "tensor"), group=(3, "group"), peer=(2, "src", "group_src"),
                      async_arg=(4, "async_op")),
    "send": OpSpec("send", (0, "tensor"), group=(2, "group"), peer=(1, "dst", "group_dst"), is_p2p=True),
    "recv": OpSpec("recv", (0, "tensor"), group=(2, "group"), peer=(1, "src", "group_src"), is_p2p=True),
    "isend": OpSpec("send", (0, "tensor"), group=(2, "group"), peer=(1, "dst", "group_dst"), is_p2p=True,
                    always_async=True),
    "irecv": OpSpec("recv", (0, "tensor"), group=(2, "group"), peer=(1, "src", "group_src"), is_p2p=True,
                    always_async=True),
    "barrier": OpSpec("barrier", group=(0, "group"), async_arg=(1, "async_op")),
    "monitored_barrier": OpSpec("barrier", group=(0, "group")),
    "all_gather_object": OpSpec("all_gather", group=(2, "group"), obj=True),
    "gather_object": OpSpec("gather", group=(3, "group"), peer=(2, "dst", "group_dst"), obj=True),
    "broadcast_object_list": OpSpec("broadcast", group=(2, "group"), peer=(1, "src", "group_src"), obj=True),
    "scatter_object_list": OpSpec("scatter", group=(3, "group"), peer=(2, "src", "group_src"), obj=True),
    "send_object_list": OpSpec("send", group=(2, "group"), peer=(1, "dst", "group_dst"), obj=True,
                               is_p2p=True),
    "recv_object_list": OpSpec("recv", group=(2, "group"), peer=(1, "src", "group_src"), obj=True,
                               is_p2p=True),
}
"""Every hooked function by its torch name (those a torch version lacks are skipped). Positions
follow torch 2.4 .. 2.13 signatures (``group_src``/``group_dst`` are newer and passed by name)."""

ROOTED = {"broadcast", "reduce", "gather", "scatter"}


def _nbytes(t) -> int | None:
    try:
        return t.numel() * t.element_size()
    except AttributeError:
        return None


def _list_nbytes(ts) -> int | None:
    try:
        return sum(t.numel() * t.element_size() for t in ts)
    except (AttributeError, TypeError):
        return None


class HookedWork:
    """Stands in for a ``Work`` handle: stamps the op complete when the job waits on it."""

    __slots__ = ("_work", "_recs", "_session", "_open")

    def __init__(self, work, recs, session):
        self._work = work
        self._recs = recs
        self._session = session
        self._open = True

    def wait(self, *args, **kwargs):
        try:
            result = self._work.wait(*args, **kwargs)
        except BaseException:
            self._close("failed")
            raise
        self._close("completed")
        return result

    def is_completed(self):
        done = self._work.is_completed()
        if done and self._open:
            self._close("completed")
        return done

    def _close(self, state: str) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self._session.complete(self._recs, state, _now())
        except Exception:  # noqa: BLE001 - recording must never break the job's wait()
            self._session.internal_error()

    def __getattr__(self, name):
        return getattr(self._work, name)

    def __del__(self):
        # Dropped without wait(): if the backend says it finished, this is the best end we know;
        # otherwise the op is counted as lost (never waited) rather than guessed.
        try:
            if self._open:
                if self._work.is_completed():
                    self._close("completed")
                else:
                    self._open = False
                    self._session.abandon(self._recs)
        except Exception:  # noqa: BLE001
            pass


def _make_wrapper(orig, spec: OpSpec, hub):
    """The function that replaces ``orig``; ``hub.session`` is looked up per call (None: pass through).

    The body is deliberately flat (argument positions bound as locals, the session's dicts used
    directly): every Python-level call saved here is ~50-100 ns off each collective.
    """
    op, is_p2p, always_async, tensor_list = spec.op, spec.is_p2p, spec.always_async, spec.tensor_list
    gpos, gname = spec.group
    tpos, tname = spec.tensor if spec.tensor else (None, None)
    apos, aname = spec.async_arg if spec.async_arg else (None, None)
    ppos, pname, gpname = spec.peer if spec.peer else (None, None, None)
    out_at, out_list = spec.out, spec.out_list
    no_payload = 0 if spec.tensor is None and not spec.obj else None  # barrier: 0 bytes of the job's own

    def hooked(*args, **kwargs):
        s = hub.session
        if s is None or not s.active or getattr(_tls, "busy", False):
            if s is not None and s.disabled_reason is not None and not getattr(_tls, "busy", False):
                s.counts["calls after disable"] += 1
            return orig(*args, **kwargs)
        try:
            n = len(args)
            group = args[gpos] if gpos < n else kwargs.get(gname)
            info = s.groups.get(id(group) if group is not None else None)
            if info is None or info[1] is None:
                info = s.group_info(group)
            if not info:  # this rank is not in the group: torch returns without communicating
                return orig(*args, **kwargs)
            gid, ranks = info[0], info[1]
            peer = None
            if is_p2p:
                peer = args[ppos] if ppos < n else kwargs.get(pname)
                if peer is None:
                    gpeer = kwargs.get(gpname)
                    if gpeer is not None:
                        peer = ranks[gpeer]
            size = no_payload
            dtype = numel = out_size = None
            cuda = False
            if tpos is not None:
                t = args[tpos] if tpos < n else kwargs.get(tname)
                if tensor_list:
                    size = _list_nbytes(t)
                    t = t[0] if t else None
                if t is not None:
                    numel = t.numel()
                    dt = s.dtypes.get(t.dtype) or s.dtype_info(t)
                    dtype = dt[0]
                    if size is None:
                        size = numel * dt[1]
                    cuda = s.cuda and t.is_cuda
            if out_at is not None:
                o = args[out_at[0]] if out_at[0] < n else kwargs.get(out_at[1])
                out_size = _list_nbytes(o) if out_list else _nbytes(o)
            is_async = always_async or (apos is not None and bool(args[apos] if apos < n else kwargs.get(aname)))
            seqs = s.seqs
            if is_p2p and peer is None:
                seq = None  # receive from any source: numbered once the sender is known
            else:
                key = (gid, op, peer) if is_p2p else gid
                seq = seqs[key] = seqs.get(key, -1) + 1
            launch = _now()
            rec = ["c", op, gid, ranks, peer, size, dtype, cuda_event() if cuda else launch, None, "pending", seq,
                   s.step_no, numel, out_size, None, launch if cuda else None]
            pending = s.pending
            pending[id(rec)] = rec
        except Exception:  # noqa: BLE001 - our bookkeeping failed; the call itself must still run
            s.internal_error()
            return orig(*args, **kwargs)
        _tls.busy = True
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            _tls.busy = False
            s.finish(rec, "failed")
            raise
        _tls.busy = False
        if is_async:
            if result is None:
                s.abandon([rec])
                return result
            try:
                return HookedWork(result, [rec], s)
            except Exception:  # noqa: BLE001
                s.internal_error()
                return result
        try:
            if is_p2p and peer is None and isinstance(result, int) and result >= 0:
                rec[4] = result  # recv from any source returns the sender's global rank
                key = (gid, op, result)
                rec[10] = seqs[key] = seqs.get(key, -1) + 1
            rec[8] = cuda_event() if cuda else _now()
            rec[9] = "completed"
            del pending[id(rec)]
            if s.active:
                buf = s.buffer  # RowBuffer.append, inlined: this is the hottest line of the hook
                buf.q.append(tuple(rec))  # a tuple of plain values leaves the GC's lists
                buf.appended_at = next(buf.counter)
        except Exception:  # noqa: BLE001
            s.internal_error()
        return result

    hooked.__wrapped__ = orig
    hooked.__name__ = getattr(orig, "__name__", "hooked")
    hooked.__qualname__ = getattr(orig, "__qualname__", hooked.__name__)
    hooked.__doc__ = getattr(orig, "__doc__", None)
    hooked._rankscope_hook = True
    return hooked


def _make_batch_wrapper(orig, hub, c10d):
    """``batch_isend_irecv``: one row per P2POp, completed by whichever returned Work is waited on."""

    def hooked(p2p_op_list):
        s = hub.session
        if s is None or not s.active or getattr(_tls, "busy", False):
            return orig(p2p_op_list)
        recs = []
        try:
            for p in p2p_op_list:
                # P2POps built from the unhooked functions must still be recognised by torch's `is` checks.
                fn = getattr(p.op, "__wrapped__", p.op)
                is_send = fn is getattr(c10d.isend, "__wrapped__", c10d.isend)
                if p.op is not c10d.isend and p.op is not c10d.irecv:
                    p.op = c10d.isend if is_send else c10d.irecv
                info = s.group_info(p.group)
                if info is None:
                    continue
                gid, ranks, _pg = info
                t = p.tensor
                recs.append(s.begin("send" if is_send else "recv", gid, ranks, getattr(p, "peer", None),
                                    t.numel() * t.element_size(), s.dtype_info(t)[0], t.numel(), None,
                                    True, t.is_cuda))
        except Exception:  # noqa: BLE001
            s.internal_error()
            s.abandon(recs)
            return orig(p2p_op_list)
        _tls.busy = True
        try:
            works = orig(p2p_op_list)
        except BaseException:
            _tls.busy = False
            for r in recs:
                s.finish(r, "failed")
            raise
        _tls.busy = False
        try:
            if not works:
                s.abandon(recs)
                return works
            if len(works) == len(recs):
                return [HookedWork(w, [r], s) for w, r in zip(works, recs)]
            # A coalesced batch gives one Work for all ops: waiting on it completes them all.
            return [HookedWork(w, recs, s) for w in works]
        except Exception:  # noqa: BLE001
            s.internal_error()
            return works

    hooked.__wrapped__ = orig
    hooked.__name__ = "batch_isend_irecv"
    hooked._rankscope_hook = True
    return hooked


class Hub:
    """Holds the one active session the wrappers report to (None: every call passes straight through)."""

    session = None


HUB = Hub()
_patched: list[tuple] = []  # (module, name, original)


def patch() -> int:
    """Wrap every call of :data:`SPECS` (and batch_isend_irecv) in torch.distributed; returns how many.

    Idempotent. Both ``torch.distributed`` and ``distributed_c10d`` get the wrapper,
    so calls through either module, and torch's own ``isend is ...`` checks, see one function.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if _patched:
        return len(_patched)
    for name, spec in SPECS.items():
        orig = getattr(c10d, name, None)
        if orig is None or getattr(orig, "_rankscope_hook", False):
            continue
        wrapper = _make_wrapper(orig, spec, HUB)
        for mod in (c10d, dist):
            if getattr(mod, name, None) is orig:
                setattr(mod, name, wrapper)
                _patched.append((mod, name, orig))
    orig = getattr(c10d, "batch_isend_irecv", None)
    if orig is not None and not getattr(orig, "_rankscope_hook", False):
        wrapper = _make_batch_wrapper(orig, HUB, c10d)
        for mod in (c10d, dist):
            if getattr(mod, "batch_isend_irecv", None) is orig:
                mod.batch_isend_irecv = wrapper
                _patched.append((mod, "batch_isend_irecv", orig))
    return len(_patched)


def unpatch() -> None:
    """Put the original functions back."""
    while _patched:
        mod, name, orig = _patched.pop()
        if getattr(getattr(mod, name, None), "_rankscope_hook", False):
            setattr(mod, name, orig)


def cuda_event():
    """A timing CUDA event recorded now on the current stream (no synchronisation)."""
    import torch

    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev
