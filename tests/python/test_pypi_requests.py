# SPDX-License-Identifier: MIT
"""test_pypi_requests.py — the requests adapter's tests
(test_requests_adapter.py) again with requests and urllib3 2 from PyPI
(the Debian run has python3-requests and urllib3 1.26)."""

from conftest import pypi_only

pypi_only()

from test_requests_adapter import *  # noqa: E402,F401,F403
