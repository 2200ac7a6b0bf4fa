"""rankscope's bootstrap: ``rankscope attach`` puts this directory first on PYTHONPATH.

Python imports ``sitecustomize`` at start-up, so every Python process of the
attached command runs this file. It first chains to the ``sitecustomize`` it
shadows (the next one on sys.path, if any), then asks rankscope to hook the
process when it is a torch.distributed rank. It never raises: a failure
leaves the job running unhooked, with one line on stderr.
"""

import importlib
import os
import sys


def _chain_to_shadowed_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    ours = [i for i, p in enumerate(saved) if os.path.abspath(p or os.curdir) == here]
    try:
        sys.path[:] = [p for p in saved if os.path.abspath(p or os.curdir) != here]
        try:
            importlib.import_module("sitecustomize")
        except ImportError as e:
            if e.name != "sitecustomize":
                raise
    except Exception as e:  # noqa: BLE001 - the same leniency site.py shows for a broken sitecustomize
        sys.stderr.write(f"rankscope hook: error in the chained sitecustomize: {type(e).__name__}: {e}\n")
    finally:
        # Keep whatever the chained file added to sys.path; put our own entry back where it was.
        for i in ours:
            sys.path.insert(min(i, len(sys.path)), saved[i])
        chained = sys.modules.get("sitecustomize")
        if me is not None:
            sys.modules["sitecustomize"] = me
            if chained is not None and chained is not me:
                me.chained = chained


def _rankscope_bootstrap():
    env = os.environ
    # Cheap pre-check (the full rule is hook_autoload.should_activate): non-rank processes such as
    # the torchrun agent should not even import rankscope.
    if not env.get("RANKSCOPE_HOOK_STORE") or env.get("RANKSCOPE_HOOK") == "0":
        return
    if env.get("RANKSCOPE_HOOK") != "1" and not ("RANK" in env and "WORLD_SIZE" in env):
        return
    try:
        from rankscope.collectors.hooks.hook_autoload import bootstrap

        bootstrap()
    except Exception as e:  # noqa: BLE001 - rankscope missing or broken in this interpreter
        try:
            sys.stderr.write(f"rankscope hook: not active ({type(e).__name__}: {e})\n")
        except Exception:  # noqa: BLE001
            pass


_chain_to_shadowed_sitecustomize()
_rankscope_bootstrap()
