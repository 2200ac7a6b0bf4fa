"""The sitecustomize bootstrap and `rankscope attach`, in real subprocesses (no torch import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rankscope.collectors.hooks.hook_autoload import should_activate

PROBE = ("import json, sys; print(json.dumps({'finder': any(type(f).__name__ == '_AfterImport' "
         "for f in sys.meta_path), 'mark': __import__('os').environ.get('SITE_MARK'), "
         "'chained': getattr(sys.modules.get('sitecustomize'), 'chained', None) is not None}))")


def boot_dir() -> str:
    from rankscope.cli.commands.attach import bootstrap_dir

    return str(bootstrap_dir())


def probe(env_extra: dict, tmp_path: Path, user_site: str | None = None) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_HOOK") and k not in ("RANK",
                                                                                                 "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([boot_dir()] + ([user_site] if user_site else []))
    env.update(env_extra)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_activation_rule():
    base = {"RANKSCOPE_HOOK_STORE": "/s"}
    assert should_activate({**base, "RANK": "0", "WORLD_SIZE": "2"})
    assert not should_activate(base)  # e.g. the torchrun agent itself
    assert should_activate({**base, "RANKSCOPE_HOOK": "1"})
    assert not should_activate({**base, "RANK": "0", "WORLD_SIZE": "2", "RANKSCOPE_HOOK": "0"})
    assert not should_activate({"RANK": "0", "WORLD_SIZE": "2"})


def test_rank_process_gets_the_import_hook_and_chains_to_the_users_sitecustomize(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['SITE_MARK'] = 'user site ran'\n")
    got, err = probe({"RANKSCOPE_HOOK_STORE": str(tmp_path), "RANK": "0", "WORLD_SIZE": "1"}, tmp_path, str(site))
    assert got == {"finder": True, "mark": "user site ran", "chained": True}, err
    got, _ = probe({"RANKSCOPE_HOOK_STORE": str(tmp_path)}, tmp_path, str(site))
    assert got == {"finder": False, "mark": "user site ran", "chained": True}


def test_a_broken_user_sitecustomize_does_not_stop_the_process(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("raise RuntimeError('user bug')\n")
    got, err = probe({"RANKSCOPE_HOOK_STORE": str(tmp_path), "RANKSCOPE_HOOK": "1"}, tmp_path, str(site))
    assert got["finder"] and "user bug" in err


def test_bad_hook_settings_leave_the_job_unhooked_not_broken(tmp_path):
    env = {"RANKSCOPE_HOOK_STORE": str(tmp_path), "RANKSCOPE_HOOK": "1",
           "RANKSCOPE_HOOK_FLUSH_INTERVAL_S": "soon"}
    code = "import torch.distributed as d; print('ran', hasattr(d.all_reduce, '_rankscope_hook'))"
    full = {**os.environ, "PYTHONPATH": boot_dir(), **env}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ran False"
    assert "RANKSCOPE_HOOK_FLUSH_INTERVAL_S" in r.stderr and "unhooked" in r.stderr


def test_attach_runs_the_command_with_the_bootstrap_and_its_exit_code(tmp_path):
    from rankscope.cli.main import main

    out = tmp_path / "env.json"
    code = ("import json, os, sys; json.dump({k: os.environ.get(k) for k in "
            "('PYTHONPATH', 'RANKSCOPE_HOOK_STORE', 'RANKSCOPE_HOOK_JOB')}, open(sys.argv[1], 'w')); sys.exit(7)")
    rc = main(["attach", "--store", str(tmp_path / "st"), "--job", "j", "--", sys.executable, "-c", code, str(out)])
    assert rc == 7
    env = json.loads(out.read_text())
    assert env["PYTHONPATH"].split(os.pathsep)[0] == boot_dir()
    assert env["RANKSCOPE_HOOK_STORE"] == str(tmp_path / "st") and env["RANKSCOPE_HOOK_JOB"] == "j"


def test_attach_rejects_bad_options_with_usage_exit(tmp_path):
    from rankscope.cli.main import main

    assert main(["attach", "--store", str(tmp_path), "--job", "a/b", "--", "true"]) == 2
    assert main(["attach", "--store", str(tmp_path), "--", "/no/such/program"]) == 2


def test_sigterm_flushes_then_the_default_action_ends_the_process(tmp_path):
    import pytest

    pytest.importorskip("torch")
    from rankscope.collectors.store import Store

    code = (
        "import os, signal, socket, torch, torch.distributed as dist\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        "dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=1)\n"
        "for _ in range(5): dist.all_reduce(torch.ones(3))\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('still alive')\n")
    env = {**os.environ, "PYTHONPATH": boot_dir(), "RANKSCOPE_HOOK": "1", "RANKSCOPE_HOOK_STORE": str(tmp_path),
           "RANKSCOPE_HOOK_FLUSH_INTERVAL_S": "1000"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == -15 and "still alive" not in r.stdout, r.stderr
    st = Store(tmp_path)
    assert st.read("comm_op").height == 5
    (m,) = st.manifest()
    assert m.notes["closed_by"] == "signal SIGTERM" and m.records == {"comm_op": 5}
