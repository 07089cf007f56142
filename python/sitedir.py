# SPDX-License-Identifier: MIT
"""sitedir.py PREFIX — where `make install` puts the libthrottle package
for the interpreter running this: the first of its package directories
that lies in PREFIX/lib (Debian's python3 with PREFIX=/usr/local:
/usr/local/lib/python3.X/dist-packages), else its own purelib directory
(a separately installed interpreter, e.g. pyenv's, that does not look
under PREFIX at all).  Printed on standard output.

Rejected: sysconfig.get_path("purelib", vars={"base": PREFIX}) alone: on
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
    print(sysconfig.get_path("purelib"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
