"""Activation without code changes: what ``hook_bootstrap/sitecustomize.py`` runs at interpreter start.

The bootstrap must cost nothing in processes that are not ranks and must not
import torch early (a job may set environment variables before it imports
torch). So it only installs a post-import hook: when ``import torch``
finishes, :func:`rankscope.collectors.hooks.enable` patches torch.distributed;
the session itself starts when the job calls ``init_process_group``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

from rankscope.collectors.hooks.hook_config import ENV_PREFIX, ENV_SWITCH

RANK_ENV = ("RANK", "WORLD_SIZE")
"""Set by torchrun (and torch.distributed.launch, and most launchers' env:// setups) in rank processes only."""


def should_activate(environ=None) -> bool:
    """True in a rank process of an attached job (or anywhere when RANKSCOPE_HOOK=1)."""
    env = os.environ if environ is None else environ
    switch = env.get(ENV_SWITCH, "").strip()
    if switch == "0" or not env.get(ENV_PREFIX + "STORE"):
        return False
    return switch == "1" or all(k in env for k in RANK_ENV)


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``callback(module)`` right after ``import <name>`` has executed the module."""

    def __init__(self, name: str, callback):
        self.name = name
        self.callback = callback
        self._finding = False
        self._loader = None

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = self._loader
        try:
            self._loader.exec_module(module)
        finally:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        try:
            self.callback(module)
        except Exception as e:  # noqa: BLE001 - the job's import of torch must succeed regardless
            _say(f"could not patch torch.distributed ({type(e).__name__}: {e}); the job runs unhooked")


def _say(msg: str) -> None:
    try:
        sys.stderr.write(f"rankscope hook: {msg}\n")
    except Exception:  # noqa: BLE001
        pass


def _enable_after_torch(_module) -> None:
    from rankscope.collectors import hooks

    hooks.enable()


def bootstrap() -> bool:
    """Arrange for the hook to enable itself in this process if it should; never raises."""
    try:
        if not should_activate():
            return False
        if "torch" in sys.modules:
            _enable_after_torch(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, _AfterImport("torch", _enable_after_torch))
        return True
    except Exception as e:  # noqa: BLE001
        _say(f"bootstrap failed ({type(e).__name__}: {e}); the job runs unhooked")
        return False
