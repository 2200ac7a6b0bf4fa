"""cli/main.run: the console script leaves without tearing the interpreter down, and loses nothing by it."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _script(body: str, *argv: str) -> subprocess.CompletedProcess:
    """``body`` then ``run()`` with ``argv``, in a fresh interpreter, as the console script runs it."""
    code = (textwrap.dedent(body) + f"\nimport sys\nsys.argv = ['rankscope', *{list(argv)!r}]\n"
            "from rankscope.cli.main import run\nrun()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_exit_status_and_all_output_come_through_a_pipe():
    ok = _script("", "--help")
    assert ok.returncode == 0
    whole = subprocess.run([sys.executable, "-c", "import sys; from rankscope.cli.main import main; sys.exit(main())",
                            "--help"], capture_output=True, text=True, timeout=120)
    assert ok.stdout == whole.stdout and ok.stdout.count("\n") > 20  # nothing lost from the buffered stream
    bad = _script("", "analyze", "--store", "/nonexistent-store", "--out-dir", "/tmp/unused")
    assert bad.returncode == 2 and "/nonexistent-store" in bad.stderr


def test_exit_handlers_still_run():
    out = _script("""
        import atexit
        atexit.register(lambda: print("handler ran"))
        """, "--version")
    assert out.returncode == 0
    assert out.stdout.splitlines()[-1] == "handler ran" and "rankscope" in out.stdout


def test_a_thread_still_working_is_waited_for(tmp_path):
    done = tmp_path / "done"
    out = _script(f"""
        import threading, time
        def work():
            time.sleep(0.3)
            open({str(done)!r}, "w").write("finished")
        threading.Thread(target=work).start()
        """, "--version")
    assert out.returncode == 0
    assert done.read_text() == "finished"  # os._exit would have killed the thread before it wrote
