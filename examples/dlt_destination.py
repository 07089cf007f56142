# SPDX-License-Identifier: MIT
"""dlt_destination.py — a dlt pipeline whose custom destination writes
batches into tables of the Hotdata API through libthrottle
(libthrottle.dlt): every pipeline process of the host writing the same
table shares one key, so a "409 RESOURCE_LOCKED, Retry-After: 5" seen by
one holds all of them back, one probes, and the rest follow; a lock, 429
or 503 becomes dlt's DestinationTransientException (the job is retried
later), a CONFLICT its DestinationTerminalException.

    python examples/dlt_destination.py URL TABLE [ROWS] [--backfill]

loads ROWS (default 100) generated rows into TABLE at URL, in batches of
10, with dlt's LOAD__WORKERS (default 8 here) load jobs at once; with
--backfill in class backfill, behind the live pipelines of the same table.
Needs dlt (pip install -r python/requirements-dlt.txt).
"""

import os
import sys

import dlt

import libthrottle.dlt
# re-exported for callers of this example's earlier form
from libthrottle.dlt import (  # noqa: F401
    DestinationTerminalException, DestinationTransientException, key_of,
    write_batch, write_batch_retrying)


def main(argv):
    args = [a for a in argv if a != "--backfill"]
    if len(args) not in (2, 3):
        sys.stderr.write(__doc__.split("\n\n")[1])
        return 64
    url, table = args[0], args[1]
    rows = int(args[2]) if len(args) == 3 else 100
    os.environ.setdefault("LOAD__WORKERS", "8")
    dest = libthrottle.dlt.destination(
        api_url=url, batch_size=10,
        klass="backfill" if "--backfill" in argv else "live")
    pipeline = dlt.pipeline("dlt_destination_example", destination=dest)
    info = pipeline.run(({"id": i} for i in range(rows)), table_name=table)
    print(info)
    return 1 if info.has_failed_jobs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
