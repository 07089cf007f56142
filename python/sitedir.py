# SPDX-License-Identifier: MIT
"""sitedir.py PREFIX — where `make install` puts the libthrottle package
for the interpreter running this, always inside PREFIX (DESTDIR is
prepended by the Makefile): the first of the interpreter's package
directories that lies in PREFIX/lib (Debian's python3 with
PREFIX=/usr/local: /usr/local/lib/python3.X/dist-packages; a venv given
as PREFIX: its site-packages), else PREFIX/lib/python3.X/site-packages
(the posix_prefix scheme), which that interpreter does not search: a
note on standard error says to put it on PYTHONPATH.  Printed on standard
output.

Rejected: the interpreter's own purelib directory when none lies in PREFIX
(it wrote outside PREFIX and DESTDIR: a staged install, or a pyenv python
with PREFIX=/usr/local, changed the interpreter's tree).
sysconfig.get_path("purelib", vars={"base": PREFIX}) alone: on
Debian it names /usr/local/local/lib/... (the posix_local scheme adds
"local"), which no interpreter searches.
"""

import os
import site
import sys
import sysconfig


def main():
    prefix = os.path.realpath(sys.argv[1])
    dirs = site.getsitepackages() if hasattr(site, "getsitepackages") else []
    dirs += [site.getusersitepackages()]
    dirs += [p for p in sys.path
             if p.endswith(("site-packages", "dist-packages"))]
    for d in dirs:
        # PREFIX/lib/...: with PREFIX=/usr, /usr/local/lib/... is not it
        rel = os.path.relpath(os.path.realpath(d), prefix)
        if rel.split(os.sep)[0] in ("lib", "lib64"):
            print(d)
            return 0
    d = sysconfig.get_path("purelib", "posix_prefix",
                           vars={"base": prefix, "platbase": prefix})
    print("note: %s does not search %s; use PYTHONPATH=%s" % (
        sys.executable, d, d), file=sys.stderr)
    print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
