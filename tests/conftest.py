"""Shared test set-up: one C++ execution context per test session.

The context is tff_clip's (`tff_clip.execution.set_local_cpp_context`), whose
worker process dies with the test process, so no TFF worker outlives pytest.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # pylint: disable=g-import-not-at-top

from tff_clip import execution  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='session', autouse=True)
def tff_context():
  execution.set_local_cpp_context()
  yield
