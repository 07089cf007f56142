#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""hotdata_mock.py — the mock Hotdata API (tests/mock_server.py) speaking
the routes the `hotdata` SDK calls on hotdata-dlt-destination's load path,
so the real destination, unmodified, loads into it.

The table loads go through mock_server's own load logic: one write at a
time per table (409 RESOURCE_LOCKED + Retry-After for the others),
workspace-wide 429 OVERLOADED windows, injected failures, and the same
counters (refused, early, loads_ok, per table and per workspace; the
workspace is the request's X-Workspace-Id).  Everything else answers at
once.

    python3 tests/hotdata_mock.py --port 0 --port-file PATH
        [every mock_server.py option] [--database ID]...
        [--declare SCHEMA.TABLE]... [--catalog-lock]

--database ID: a database that exists from the start (id ID, its
connection "conn_ID"), for pipelines that pin database_id so that several
of them write the same tables; --catalog-lock: one load at a time per
database, over all its tables (the lock the destination says the API
takes; its counters are then under "WORKSPACE/conn_ID"), else per
table; --declare: a table each of them has
declared from the start, as after a pipeline's first run (two first runs
at once both declare a missing table, and the second is answered 409
CONFLICT, which hotdata-dlt-destination 0.17 takes as terminal).  Both
survive /admin/reset.

Routes (what the SDK sends; answers in the SDK's models' shapes)
  POST /v1/databases                       create (201), tables declared
  GET  /v1/databases/{id}                  the database (404 if unknown)
  POST /v1/databases/{id}/schemas/{s}/tables   declare a table (201;
                                           409 CONFLICT if declared)
  GET  /v1/information_schema?connection_id=..  the declared tables;
                                           synced once a load ran
  POST /v1/uploads                         a single-PUT upload session
  PUT  /storage/{upload_id}                the upload's bytes
  POST /v1/uploads/{id}/finalize           finalize (needs the token)
  POST /v1/connections/{c}/schemas/{s}/tables/{t}/loads
                                           the table load (the serialised
                                           write); a load of an upload
                                           already loaded is answered with
                                           its receipt (counted as replays)
  POST /v1/query, GET /v1/query-runs/{id}  every query run fails "relation
                                           not found": the mock keeps no
                                           queryable data, which the
                                           destination reads as "nothing
                                           stored yet" (no schema, no
                                           state to restore)
Counters in /stats: mock_server.py's, and "hotdata": databases, declared,
uploads, finalized, queries, replays, unknown (requests to routes the mock
does not know; each is also logged on stderr).
"""

import datetime
import itertools
import os
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mock_server  # noqa: E402
from mock_server import DEFAULT_WS, Handler  # noqa: E402

_ids = itertools.count(1)


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class Hotdata:
    """Databases, uploads and query runs; guarded by the State's lock."""

    def __init__(self, seeded, declared):
        self.seeded = list(seeded)
        self.declared = [d.split(".", 1) for d in declared]
        self.reset()

    def reset(self):
        self.databases = {}  # id -> {"name", "conn", "tables": {(s, t)}}
        self.by_conn = {}  # connection id -> database id
        self.synced = set()  # (connection id, schema, table) loaded once
        self.uploads = {}  # id -> {"token", "size", "final", "receipt"}
        self.runs = {}  # query run id -> sql
        self.c = dict(databases=0, declared=0, uploads=0, finalized=0,
                      queries=0, replays=0, unknown=0)
        for db in self.seeded:
            self.create(db, db, [{"name": s, "tables": [{"name": t}]}
                                 for s, t in self.declared])

    def create(self, db_id, name, schemas):
        conn = "conn_" + db_id
        self.databases[db_id] = {"name": name, "conn": conn,
                                 "tables": set()}
        self.by_conn[conn] = db_id
        for sch in schemas or []:
            for tab in sch.get("tables") or []:
                self.databases[db_id]["tables"].add((sch["name"],
                                                     tab["name"]))
        return self.databases[db_id]


class HotdataHandler(Handler):
    server_version = "mock-hotdata-api/1"

    @property
    def hd(self):
        return self.server.hotdata

    def route(self):
        u = urllib.parse.urlsplit(self.path)
        return u.path.rstrip("/").split("/"), urllib.parse.parse_qs(u.query)

    def workspace_id(self):
        return self.headers.get("X-Workspace-Id") or DEFAULT_WS

    def unknown(self, method):
        with self.server.state.lock:
            self.hd.c["unknown"] += 1
        sys.stderr.write("hotdata mock: no route for %s %s\n"
                         % (method, self.path))
        self.error(404, "NOT_FOUND", "no route for %s %s"
                   % (method, self.path))

    def detail(self, db_id, db):
        return {"attachments": [], "created_at": now_iso(),
                "default_catalog": "default",
                "default_connection_id": db["conn"],
                "default_schema": "public", "id": db_id, "name": db["name"]}

    # ---- GET --------------------------------------------------------------

    def do_GET(self):
        parts, q = self.route()
        st = self.server.state
        if parts == ["", "stats"]:
            self.read_body()
            with st.lock:
                s = st.stats()
                s["hotdata"] = dict(self.hd.c)
            return self.answer(200, s)
        self.read_body()
        if parts[:3] == ["", "v1", "databases"] and len(parts) == 4:
            with st.lock:
                db = self.hd.databases.get(parts[3])
            if db is None:
                return self.error(404, "NOT_FOUND",
                                  "database %r not found" % parts[3])
            return self.answer(200, self.detail(parts[3], db))
        if parts == ["", "v1", "information_schema"]:
            conn = (q.get("connection_id") or [""])[0]
            want_s = (q.get("schema") or [None])[0]
            want_t = (q.get("table") or [None])[0]
            with st.lock:
                db = self.hd.databases.get(self.hd.by_conn.get(conn, ""))
                rows = [] if db is None else [
                    {"connection": conn, "schema": s, "table": t,
                     "synced": (conn, s, t) in self.hd.synced,
                     "last_sync": None, "partition_by": [],
                     "sorted_by": [], "columns": None}
                    for s, t in sorted(db["tables"])
                    if want_s in (None, s) and want_t in (None, t)]
            return self.answer(200, {"count": len(rows), "has_more": False,
                                     "limit": len(rows), "next_cursor": None,
                                     "tables": rows})
        if parts[:3] == ["", "v1", "query-runs"] and len(parts) == 4:
            with st.lock:
                sql = self.hd.runs.get(parts[3])
            if sql is None:
                return self.error(404, "NOT_FOUND", "no query run %r"
                                  % parts[3])
            return self.answer(200, {
                "id": parts[3], "created_at": now_iso(),
                "completed_at": now_iso(), "snapshot_id": "snap_mock",
                "sql_hash": "%08x" % (hash(sql) & 0xffffffff),
                "sql_text": sql, "status": "failed",
                "error_message": "relation not found: this mock keeps no "
                                 "queryable tables"})
        self.unknown("GET")

    # ---- PUT: the storage side of an upload -------------------------------

    def do_PUT(self):
        parts, _ = self.route()
        raw = self.read_body()
        st = self.server.state
        if parts[:2] == ["", "storage"] and len(parts) == 3:
            with st.lock:
                up = self.hd.uploads.get(parts[2])
                if up is not None:
                    up["size"] = len(raw)
            if up is None:
                return self.error(404, "NOT_FOUND", "no upload %r" % parts[2])
            return self.answer(200, {}, [("ETag", '"%x"' % len(raw))])
        self.unknown("PUT")

    # ---- POST -------------------------------------------------------------

    def do_POST(self):
        parts, _ = self.route()
        if parts[:2] == ["", "admin"]:
            return super().do_POST()
        raw = self.read_body()
        st = self.server.state
        obj = self.json_body(raw) or {}
        if parts == ["", "v1", "databases"]:
            db_id = "db_%d" % next(_ids)
            with st.lock:
                db = self.hd.create(db_id, obj.get("name") or db_id,
                                    obj.get("schemas"))
                self.hd.c["databases"] += 1
            d = self.detail(db_id, db)
            del d["attachments"], d["created_at"]
            return self.answer(201, d)
        if len(parts) == 7 and parts[:3] == ["", "v1", "databases"] and \
                parts[4] == "schemas" and parts[6] == "tables":
            name = obj.get("name")
            with st.lock:
                db = self.hd.databases.get(parts[3])
                new = db is not None and isinstance(name, str) and \
                    (parts[5], name) not in db["tables"]
                if new:
                    db["tables"].add((parts[5], name))
                    self.hd.c["declared"] += 1
            if db is None:
                return self.error(404, "NOT_FOUND", "no database %r"
                                  % parts[3])
            if not new:
                return self.error(409, "CONFLICT",
                                  "table %r already exists" % name)
            return self.answer(201, {"connection_id": db["conn"],
                                     "schema": parts[5], "table": name})
        if parts == ["", "v1", "uploads"]:
            if obj.get("declared_size_bytes") is None:
                return self.error(400, "BAD_REQUEST", "this mock takes "
                                  "known-size single uploads only")
            up_id = "upl_%d" % next(_ids)
            token = "tok_%s" % up_id
            with st.lock:
                self.hd.uploads[up_id] = {"token": token, "size": None,
                                          "final": False, "receipt": None}
                self.hd.c["uploads"] += 1
            host = self.headers.get("Host") or "127.0.0.1"
            return self.answer(201, {
                "upload_id": up_id, "finalize_token": token, "headers": {},
                "mode": "single", "part_size": None, "part_urls": None,
                "url": "http://%s/storage/%s" % (host, up_id)})
        if len(parts) == 5 and parts[:3] == ["", "v1", "uploads"] and \
                parts[4] == "finalize":
            with st.lock:
                up = self.hd.uploads.get(parts[3])
                ok = up is not None and up["size"] is not None and \
                    self.headers.get("X-Upload-Finalize-Token") == up["token"]
                if ok:
                    up["final"] = True
                    self.hd.c["finalized"] += 1
            if not ok:
                return self.error(400, "BAD_REQUEST", "upload %r: not "
                                  "uploaded, or a wrong token" % parts[3])
            return self.answer(200, {
                "upload_id": parts[3], "status": "ready",
                "size_bytes": up["size"], "created_at": now_iso(),
                "content_type": "application/octet-stream"})
        if len(parts) == 9 and parts[:3] == ["", "v1", "connections"] and \
                parts[4] == "schemas" and parts[6] == "tables" and \
                parts[8] == "loads":
            return self.table_load(parts[3], parts[5], parts[7], obj, raw)
        if parts == ["", "v1", "query"]:
            run = "qrun_%d" % next(_ids)
            with st.lock:
                self.hd.runs[run] = str(obj.get("sql", ""))
                self.hd.c["queries"] += 1
            return self.answer(202, {"query_run_id": run, "status": "running",
                                     "reason": None,
                                     "status_url": "/v1/query-runs/" + run})
        self.unknown("POST")

    def table_load(self, conn, schema, table, obj, raw):
        st = self.server.state
        up_id = obj.get("upload_id")
        with st.lock:
            db = self.hd.databases.get(self.hd.by_conn.get(conn, ""))
            declared = db is not None and (schema, table) in db["tables"]
            up = self.hd.uploads.get(up_id)
            receipt = up["receipt"] if up is not None else None
            if receipt is not None:
                self.hd.c["replays"] += 1
        if not declared:
            return self.error(404, "NOT_FOUND", "table %s.%s not found on "
                              "connection %r" % (schema, table, conn))
        if up is None or not up["final"]:
            return self.error(404, "NOT_FOUND", "upload %r not found or not "
                              "finalized" % up_id)
        if receipt is not None:  # the same upload again: its receipt
            return self.answer(200, receipt)
        self.load_ctx = (conn, schema, table, up_id)
        unit = conn if self.server.args.catalog_lock else table
        self.v1(self.workspace_id(), unit,
                lambda t: self.load(t, table, raw))

    def load_done(self, t, name, raw):
        conn, schema, table, up_id = self.load_ctx
        st = self.server.state
        receipt = {"arrow_schema_json": "{}", "connection_id": conn,
                   "row_count": t.loads_ok, "schema_name": schema,
                   "table_name": table}
        with st.lock:
            self.hd.synced.add((conn, schema, table))
            self.hd.uploads[up_id]["receipt"] = receipt
        self.answer(200, receipt)

    def admin(self, what, raw):
        if what == "reset":
            with self.server.state.lock:
                self.hd.reset()
        return super().admin(what, raw)


def options(ap):
    ap.add_argument("--database", action="append", default=[], metavar="ID",
                    help="a database that exists from the start "
                         "(repeatable)")
    ap.add_argument("--catalog-lock", action="store_true",
                    help="one load at a time per database, not per table")
    ap.add_argument("--declare", action="append", default=[],
                    metavar="SCHEMA.TABLE",
                    help="a table the --database databases have declared "
                         "from the start (repeatable)")


def setup(srv):
    for d in srv.args.declare:
        if "." not in d.strip("."):
            raise SystemExit("--declare takes SCHEMA.TABLE: %r" % d)
    srv.hotdata = Hotdata(srv.args.database, srv.args.declare)


if __name__ == "__main__":
    sys.exit(mock_server.main(HotdataHandler, options, __doc__, setup))
