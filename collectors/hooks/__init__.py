"""Live hooks: record a running PyTorch job's communication into a trace store.

Without code changes::

    rankscope attach --store st --job llama -- torchrun --nproc_per_node=8 train.py

or from the training script::

    from rankscope.collectors import hooks
    hooks.enable(store="st", job="llama")   # before or after init_process_group
    for batch in data:
        ...
        hooks.batch_meta(seq_lens=[...])      # optional
        optimizer.step()
        hooks.step()                          # optional: steps are marked from optimizer.step otherwise

Every torch.distributed collective and point-to-point call becomes a comm_op
row; steps become step_mark rows; per-microbatch sequence lengths
batch_meta rows; CUDA kernels compute_op rows (with CUPTI). Importing this
package does not import torch; :func:`enable` does.

Nothing here raises into the training loop: bad options given to
:func:`enable` raise ConfigError at the call, everything after that is
counted, logged once (logger ``rankscope.hooks``) and reported at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

from rankscope.collectors.hooks.hook_comm import HUB
from rankscope.collectors.hooks.hook_config import HookConfig

__all__ = ["HookConfig", "enable", "step", "batch_meta", "disable", "report"]

log = logging.getLogger("rankscope.hooks")
_lock = threading.RLock()
_state = {"config": None, "lifecycle": False, "atexit": False, "cupti": None}


def enable(store: str | None = None, job: str | None = None, **options) -> bool:
    """Start recording this process's torch.distributed calls; True when the hook is in place.

    ``store``/``job`` and any :class:`HookConfig` field may be given here; the
    ``RANKSCOPE_HOOK_*`` environment fills in the rest. Recording starts at
    once if the process group exists, else when ``init_process_group`` returns.
    """
    config = HookConfig.from_env(store=store, job=job, **options)
    with _lock:
        try:
            import torch.distributed as dist

            if not dist.is_available():
                log.warning("rankscope hook: this torch has no torch.distributed; nothing to record")
                return False
            from rankscope.collectors.hooks import hook_comm

            _state["config"] = config
            hook_comm.patch()
            _patch_lifecycle()
            if not _state["atexit"]:
                atexit.register(_at_exit)
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _state["atexit"] = True
            if dist.is_initialized():
                _start_session()
            return True
        except Exception as e:  # noqa: BLE001 - a hook that cannot start must leave the job alone
            log.warning("rankscope hook: could not enable (%s: %s); the job runs unhooked", type(e).__name__, e)
            return False


def step() -> None:
    """Mark the end of the current training step (turns off marking from optimizer.step)."""
    s = HUB.session
    if s is not None:
        try:
            s.mark_step(explicit=True)
        except Exception:  # noqa: BLE001
            s.internal_error()


def batch_meta(seq_lens, step: int | None = None) -> None:
    """Record the sequence length (tokens) of each microbatch of the current (or given) step."""
    s = HUB.session
    if s is not None:
        try:
            s.batch_meta(seq_lens, step)
        except Exception:  # noqa: BLE001
            s.internal_error()


def report() -> dict | None:
    """What the current session recorded, wrote and lost so far (None when not recording)."""
    s = HUB.session
    return s.report() if s is not None else None


def disable() -> dict | None:
    """Stop recording, write what is buffered, put torch.distributed back; returns the final report."""
    with _lock:
        s, HUB.session = HUB.session, None
        rep = None
        if s is not None:
            rep = _close(s, "disable")
        try:
            from rankscope.collectors.hooks import hook_comm

            hook_comm.unpatch()
            _unpatch_lifecycle()
        except Exception:  # noqa: BLE001
            pass
        _state["config"] = None
        return rep


# ------------------------------------------------------------------ internals
def _start_session() -> None:
    """Called once the process group exists: create the rank's session and its threads."""
    with _lock:
        config = _state["config"]
        if config is None or (HUB.session is not None and not HUB.session._closed):
            return
        import torch.distributed as dist

        from rankscope.collectors.hooks.hook_session import HookSession

        s = HookSession(config, dist.get_rank())
        s.start()
        HUB.session = s
        if config.cupti:
            from rankscope.collectors.hooks import hook_cupti

            _state["cupti"] = hook_cupti.start(s)


def _close(s, reason: str) -> dict | None:
    try:
        c = _state.pop("cupti", None)
        _state["cupti"] = None
        if c is not None:
            c.stop()
        return s.close(reason=reason)
    except Exception:  # noqa: BLE001
        return None


def _at_exit() -> None:
    s = HUB.session
    if s is not None:
        _close(s, "exit")


def _after_fork_in_child() -> None:
    s = HUB.session
    if s is not None:
        s.after_fork_in_child()


_lifecycle_patched: list = []


def _patch_lifecycle() -> None:
    """Start the session when init_process_group returns; forget cached groups when they are destroyed."""
    if _lifecycle_patched:
        return
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    def after_init(orig):
        def init_process_group(*args, **kwargs):
            result = orig(*args, **kwargs)
            try:
                _start_session()
            except Exception as e:  # noqa: BLE001
                log.warning("rankscope hook: could not start recording (%s: %s); the job runs unhooked",
                            type(e).__name__, e)
            return result
        return init_process_group

    def before_destroy(orig):
        def destroy_process_group(*args, **kwargs):
            s = HUB.session
            if s is not None:
                s.forget_groups()
            return orig(*args, **kwargs)
        return destroy_process_group

    for name, make in (("init_process_group", after_init), ("destroy_process_group", before_destroy)):
        orig = getattr(c10d, name)
        wrapper = make(orig)
        wrapper.__wrapped__, wrapper.__doc__ = orig, orig.__doc__
        for mod in (c10d, dist):
            if getattr(mod, name, None) is orig:
                setattr(mod, name, wrapper)
                _lifecycle_patched.append((mod, name, orig))


def _unpatch_lifecycle() -> None:
    while _lifecycle_patched:
        mod, name, orig = _lifecycle_patched.pop()
        setattr(mod, name, orig)
