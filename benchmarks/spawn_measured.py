"""Run one command and write its wall time, peak RSS, CPU time and exit status as JSON to argv[1].

Linux starts a child's ``ru_maxrss`` at the RSS of the process that forked it (the high-water mark
survives exec), so a benchmark that had grown to 350 MiB reported every command it timed at 350 MiB
or more. This launcher is started with ``python -S`` (a few MiB) and forks the command itself, so the
peak it reports is the command's own.

usage: python -S spawn_measured.py OUT.json SHELL(0|1) CMD...
"""

import json
import os
import subprocess
import sys
import time


def main() -> None:
    out, shell, cmd = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
    t = time.perf_counter()
    p = subprocess.Popen(cmd[0] if shell else cmd, shell=shell)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    with open(out, "w") as f:
        json.dump({"wall_s": wall, "maxrss_kib": ru.ru_maxrss, "cpu_s": ru.ru_utime + ru.ru_stime,
                   "rc": os.waitstatus_to_exitcode(status)}, f)


if __name__ == "__main__":
    main()
