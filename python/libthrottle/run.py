# SPDX-License-Identifier: MIT
"""python -m libthrottle.run — start a Python program with its HTTP
requests routed through the gate, without changing it (in the manner of
opentelemetry-instrument):

    python -m libthrottle.run --rule hotdata -- python my_pipeline.py
    python -m libthrottle.run --rule 'hotdata class=backfill' -- dlt ...
    python -m libthrottle.run \\
        --rule 'POST /v1/tables/{table}/load hotdata:{host}/{table} cap=auto' \\
        -- python loader.py

Each --rule is a rule string of libthrottle.instrument (a preset name, or
[METHOD] PATH KEY [OPTION]...; the first that matches a request is used).
The command runs in place of this process (same pid, signals, exit
status) with LIBTHROTTLE_RULES holding the rules and a sitecustomize on
its PYTHONPATH that calls libthrottle.instrument() before the program's
first line; every Python process it starts inherits both.  THROTTLE_*
(the segment, THROTTLE_BACKEND for Redis) reach it as usual.  The rules
are checked here first: a bad one exits 64 before anything runs.
"""

import argparse
import os
import sys

from .instrument import PRESETS, parse_rules

BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" in argv:
        i = argv.index("--")
        ours, cmd = argv[:i], argv[i + 1:]
    else:
        ours, cmd = argv, []
    ap = argparse.ArgumentParser(
        prog="python -m libthrottle.run",
        description="run CMD with its matching HTTP requests admitted, "
                    "reported and retried through libthrottle",
        epilog="presets: %s" % ", ".join(sorted(PRESETS)))
    ap.add_argument("--rule", action="append", default=[], required=True,
                    help="a rule (repeatable; see libthrottle.instrument)")
    args = ap.parse_args(ours)
    if not cmd:
        ap.print_usage(sys.stderr)
        sys.stderr.write("python -m libthrottle.run: no command after --\n")
        return 64
    try:
        parse_rules(args.rule)
    except ValueError as e:
        sys.stderr.write("python -m libthrottle.run: %s\n" % e)
        return 64
    if not os.path.exists(os.path.join(BOOT, "sitecustomize.py")):
        sys.stderr.write("python -m libthrottle.run: %s/sitecustomize.py is "
                         "missing (an incomplete install): the command "
                         "would run uninstrumented\n" % BOOT)
        return 70
    env = dict(os.environ)
    env["LIBTHROTTLE_RULES"] = "\n".join(args.rule)
    path = [BOOT, PACKAGE_PARENT] + [p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        sys.stderr.write("python -m libthrottle.run: %s: %s\n"
                         % (cmd[0], e.strerror))
        return 127 if isinstance(e, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main())
