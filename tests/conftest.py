"""Shared test set-up: one C++ execution context per test session.

The context is tff_clip's (`tff_clip.execution.set_local_cpp_context`), whose
worker process dies with the test process, so no TFF worker outlives pytest.
Under pytest-xdist (`make test`) each worker process has its own; the
controlling process runs no test and never imports TensorFlow.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='session', autouse=True)
def tff_context():
  from tff_clip import execution  # pylint: disable=g-import-not-at-top
  execution.set_local_cpp_context()
  yield
