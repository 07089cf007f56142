# SPDX-License-Identifier: MIT
"""mockproc.py — one of the tests' mock servers run as a child process for
a bench: started on a free port (read from the port file it writes), with
its /admin and /stats endpoints, stopped and its files removed at the end.
Shared by py_fleet.py and dlt_bench.py."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request


class MockProcess:
    def __init__(self, script, args, what="the mock server", timeout=30):
        self.dir = tempfile.mkdtemp(prefix="tt-bench-mock-")
        pf = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen([sys.executable, script, "--port", "0",
                                      "--port-file", pf] + list(args))
        end = time.monotonic() + timeout
        while not os.path.exists(pf) or os.path.getsize(pf) == 0:
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                sys.exit("%s: %s did not start" %
                         (os.path.basename(sys.argv[0]), what))
            time.sleep(0.01)
        with open(pf) as f:
            self.url = "http://127.0.0.1:%d" % int(f.read())

    def admin(self, what, obj=None):
        req = urllib.request.Request("%s/admin/%s" % (self.url, what),
                                     data=json.dumps(obj or {}).encode(),
                                     method="POST")
        body = urllib.request.urlopen(req, timeout=10).read()
        return json.loads(body) if body.strip() else None

    def stats(self):
        return json.load(urllib.request.urlopen(self.url + "/stats",
                                                timeout=10))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
