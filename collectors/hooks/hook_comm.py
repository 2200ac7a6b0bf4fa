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

import ast
import inspect
import os
import textwrap
import time
from threading import get_ident

from rankscope.collectors.record_class import record

_busy: set[int] = set()
"""Threads inside a hooked call that itself calls hooked functions (their inner calls are not recorded)."""
_now = time.time_ns


@record
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


def _make_wrapper(orig, spec: OpSpec, hub, nests: bool = True):
    """The function that replaces ``orig``; ``hub.session`` is looked up per call (None: pass through).

    ``nests``: whether ``orig`` itself calls hooked functions (torch's ``send`` calls ``isend``), so the
    thread is marked busy while it runs and the inner calls pass through unrecorded. Leaf calls skip
    the mark: they are the hot ones.

    The body is deliberately flat (argument positions bound as locals, the session's containers used
    directly, the finished row built once as a tuple). Measured on a 1-rank gloo all_reduce, whose
    ~100 us of syscalls leave the caches cold, each line here costs several times its warm price:
    every attribute load and call saved is ~0.1-0.5 us off each collective (benchmarks/bench_hooks.py).
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
        if s is None or not s.active or (_busy and get_ident() in _busy):
            if s is not None and s.disabled_reason is not None and not (_busy and get_ident() in _busy):
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
            if is_p2p:
                # receive from any source: numbered once the sender is known
                seq = None if peer is None else next(seqs[gid, op, peer])
            else:
                seq = next(seqs[gid])
            step = s.step_no
            launch = _now()
            rec = ["c", op, gid, ranks, peer, size, dtype, cuda_event() if cuda else launch, None, "pending", seq,
                   step, numel, out_size, None, launch if cuda else None]
            pending = s.pending
            key = id(rec)
            pending[key] = rec
        except Exception:  # noqa: BLE001 - our bookkeeping failed; the call itself must still run
            s.internal_error()
            return orig(*args, **kwargs)
        if nests:
            tid = get_ident()
            _busy.add(tid)
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            if nests:
                _busy.discard(tid)
            s.finish(rec, "failed")
            raise
        if nests:
            _busy.discard(tid)
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
            end = cuda_event() if cuda else _now()
            del pending[key]
            if peer is None and is_p2p and isinstance(result, int) and result >= 0:
                peer = result  # recv from any source returns the sender's global rank
                seq = next(seqs[gid, op, result])
            if s.active:
                buf = s.buffer  # RowBuffer.append, inlined: this is the hottest line of the hook
                buf.q.append(("c", op, gid, ranks, peer, size, dtype, rec[7], end, "completed", seq, step, numel,
                              out_size, None, rec[15]))
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


def fast_path_available() -> str | None:
    """Why the C hot path is off (None: it is on). ``RANKSCOPE_HOOK_PURE_PYTHON=1`` turns it off."""
    if os.environ.get("RANKSCOPE_HOOK_PURE_PYTHON") == "1":
        return "RANKSCOPE_HOOK_PURE_PYTHON=1"
    try:
        from rankscope.collectors.hooks.hook_fastcall import FastHook  # noqa: F401
    except ImportError as e:
        return f"the C extension is not built ({e})"
    return None


def new_ring(max_rows: int):
    """A ring for the C hot path's calls, or None when that path is off."""
    if fast_path_available() is not None:
        return None
    from rankscope.collectors.hooks.hook_fastcall import Ring

    return Ring(max_rows)


def use_ring(ring, unless_other=None) -> None:
    """Make ``ring`` the one the C hot path records into (None: none). With ``unless_other``, only clear
    it when that ring is still the current one (a newer session may have taken over)."""
    try:
        from rankscope.collectors.hooks.hook_fastcall import get_current, set_current
    except ImportError:
        return
    if unless_other is not None and get_current() is not unless_other:
        return
    set_current(ring)


def fast_eligible(spec: OpSpec) -> bool:
    """Whether a call of ``spec`` can take the C hot path: one tensor in, at most one tensor out."""
    return (spec.tensor is not None and not spec.tensor_list and not spec.out_list and not spec.obj
            and not spec.always_async)


def make_hook(orig, spec: OpSpec, hub, nests: bool = True, fast: bool | None = None):
    """The wrapper for ``orig``: the Python one, fronted by the C hot path where the call allows it.

    ``fast``: None uses the C path when it is built and not turned off (:func:`fast_path_available`).
    """
    slow = _make_wrapper(orig, spec, hub, nests)
    if fast is None:
        fast = fast_path_available() is None
    if not fast or not fast_eligible(spec):
        return slow
    from rankscope.collectors.hooks.hook_fastcall import FastHook

    ppos, pname = spec.peer[:2] if spec.is_p2p else (None, None)
    hook = FastHook(orig=orig, slow=slow, hub=hub, busy=_busy, op=spec.op, group=spec.group, tensor=spec.tensor,
                    async_arg=spec.async_arg or (None, None), peer=(ppos, pname), out=spec.out or (None, None),
                    p2p=spec.is_p2p, nests=nests)
    for name in ("__wrapped__", "__name__", "__qualname__", "__doc__", "_rankscope_hook"):
        setattr(hook, name, getattr(slow, name))
    hook.__module__ = getattr(orig, "__module__", None)
    return hook


def calls_hooked(fn, names) -> bool:
    """Whether ``fn``'s own source calls one of ``names`` as a module-level function (so it nests).

    Without readable source the answer is True: marking a leaf busy only costs time, while missing a
    nesting call would record its inner calls twice.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(fn))))
    except (OSError, TypeError, SyntaxError, ValueError):
        return True
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
               for node in ast.walk(tree))


def _make_batch_wrapper(orig, hub, c10d):
    """``batch_isend_irecv``: one row per P2POp, completed by whichever returned Work is waited on."""

    def hooked(p2p_op_list):
        s = hub.session
        if s is None or not s.active or (_busy and get_ident() in _busy):
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
        tid = get_ident()
        _busy.add(tid)
        try:
            works = orig(p2p_op_list)
        except BaseException:
            _busy.discard(tid)
            for r in recs:
                s.finish(r, "failed")
            raise
        _busy.discard(tid)
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
    hooked_names = {*SPECS, "batch_isend_irecv"}
    for name, spec in SPECS.items():
        orig = getattr(c10d, name, None)
        if orig is None or getattr(orig, "_rankscope_hook", False):
            continue
        wrapper = make_hook(orig, spec, HUB, nests=spec.obj or calls_hooked(orig, hooked_names))
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
