"""Run one benchmarked command and report its own CPU time and peak memory (tools/bench.py).

Linux keeps a process's peak RSS across fork and exec: a command started straight from the
bench inherits the bench's own peak (the pairs, the tables it holds), so ``wait4`` would report
at least that. Started from this small launcher instead, the command's peak starts from the
launcher's few MB and ``wait4`` here gives the command's own.

    python3 -S bench_launch.py USAGE_JSON CMD [ARG ...]

Writes ``{"cpu": seconds, "maxrss": bytes}`` to USAGE_JSON and exits with the command's code.
"""
import json
import os
import sys


def main() -> int:
    usage_path, cmd = sys.argv[1], sys.argv[2:]
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    _, status, ru = os.wait4(pid, 0)
    with open(usage_path, "w") as f:
        json.dump({"cpu": ru.ru_utime + ru.ru_stime, "maxrss": ru.ru_maxrss * 1024}, f)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
