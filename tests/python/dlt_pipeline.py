# SPDX-License-Identifier: MIT
"""dlt_pipeline.py — a real dlt pipeline loading into the Hotdata mock
(tests/hotdata_mock.py) through the real hotdata-dlt-destination,
unmodified: what the dlt tests and bench/dlt_bench.py run, plain or under
`python -m libthrottle.run`.

    python dlt_pipeline.py --url URL --database ID --table T --jobs N
        [--name NAME] [--runs K] [--every S] [--workers W] [--dir DIR]

--jobs N rows, one per file, so N load jobs into table T; --runs K
pipeline runs (each of N jobs) --every S seconds apart (a live schedule);
--workers W is LOAD__WORKERS.  The pipeline pins the database (several
pipelines then write the same tables), loads in parallel
(loader_parallelism_strategy "parallel": the destination's default,
"sequential", would run one job at a time), and does not restore state
from the destination (restore_from_destination false: the mock keeps no
queryable data).  Prints one JSON line at the end: jobs, completed, failed
(jobs that ended failed or still retrying when dlt gave up), runs, error
(the exception dlt raised, or null), load_s (each run's load step,
seconds), start/end (time.time() of the first load and of the last).
"""

import argparse
import json
import os
import sys
import time


# The tables a pipeline into TABLE has declared after its first run (the
# mock's --declare; dlt's bookkeeping tables and TABLE, schema public).
def declared(table="orders"):
    return ["public." + t for t in (table, "_dlt_version", "_dlt_loads",
                                    "_dlt_pipeline_state")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--database", required=True)
    ap.add_argument("--workspace", default="ws1")
    ap.add_argument("--table", default="orders")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--every", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--name", default="loader")
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()

    os.environ.update({
        "DLT_DATA_DIR": os.path.join(a.dir, "data"),
        "DLT_PROJECT_DIR": a.dir,
        "RUNTIME__LOG_LEVEL": "WARNING",
        "RUNTIME__DLTHUB_TELEMETRY": "false",
        "LOAD__WORKERS": str(a.workers),
        "NORMALIZE__DATA_WRITER__FILE_MAX_ITEMS": "1",
        "NORMALIZE__DATA_WRITER__BUFFER_MAX_ITEMS": "1",
        "RESTORE_FROM_DESTINATION": "false",
    })
    import dlt
    from hotdata_dlt_destination import hotdata

    dest = hotdata(credentials={"api_key": "test-key"},
                   workspace_id=a.workspace, api_base_url=a.url,
                   database_id=a.database,
                   loader_parallelism_strategy="parallel")
    pipe = dlt.pipeline(pipeline_name=a.name, destination=dest,
                        dataset_name="public",
                        pipelines_dir=os.path.join(a.dir, "pipelines"))

    out = dict(name=a.name, jobs=0, completed=0, failed=0, runs=0,
               error=None, load_s=[], start=None, end=None)
    first = None
    for r in range(a.runs):
        if a.every and first is not None:
            time.sleep(max(0.0, first + r * a.every - time.time()))
        rows = [{"id": r * a.jobs + i, "run": r, "who": a.name}
                for i in range(a.jobs)]
        pipe.extract(rows, table_name=a.table)
        pipe.normalize()
        t0 = time.time()
        first = first if first is not None else t0
        out["start"] = out["start"] or t0
        try:
            info = pipe.load()
        except Exception as e:  # dlt gave up: count what it left behind
            out["error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
            info = None
        out["end"] = time.time()
        out["load_s"].append(out["end"] - t0)
        out["runs"] += 1
        if info is not None:
            for pkg in info.load_packages:
                for state, jobs in pkg.jobs.items():
                    mine = [j for j in jobs if
                            j.job_file_info.table_name == a.table]
                    out["jobs"] += len(mine)
                    if state == "completed_jobs":
                        out["completed"] += len(mine)
                    elif state in ("failed_jobs", "new_jobs",
                                   "started_jobs"):
                        out["failed"] += len(mine)
        else:
            out["jobs"] += a.jobs
            out["failed"] += a.jobs
            break
    print(json.dumps(out), flush=True)
    return 0 if out["error"] is None and out["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
