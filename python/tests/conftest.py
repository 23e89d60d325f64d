"""Every test has a deadline: ``@pytest.mark.deadline(seconds)`` (default
120 s). Past it, faulthandler prints every thread's stack and ends the
run (exit code 1): a hang fails loudly instead of stalling the script.
The multi-process helpers (ranks.py) have their own, shorter deadlines."""

import faulthandler
import sys

import pytest

DEFAULT_DEADLINE = 120


def pytest_configure(config):
    config.addinivalue_line("markers", "deadline(seconds): the test's hard time limit")


@pytest.fixture(autouse=True)
def _deadline(request):
    m = request.node.get_closest_marker("deadline")
    seconds = m.args[0] if m else DEFAULT_DEADLINE
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()
