"""Shared test set-up: one C++ execution context per test session.

The context is tff_clip's (`tff_clip.runtime.execution.set_local_cpp_context`), whose
worker process dies with the test process, so no TFF worker outlives pytest.
Under pytest-xdist (`make test`) each worker process has its own; the
controlling process runs no test and never imports TensorFlow.

Hypothesis is derandomized (the 'tff_clip' settings profile).
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# Tests neither read nor fill the user's cache of traced graphs (nor do the
# programs they start); tests/test_graph_cache.py points it at a temporary
# directory.
os.environ['TFF_CLIP_GRAPH_CACHE'] = 'off'

from hypothesis import settings  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

# Property tests draw the same examples on every run (derived from each
# test's name): a test passes or fails for its code, never by the luck of a
# draw, and a failure seen once is seen again. `deadline=None`: a first
# call traces TensorFlow functions and takes seconds.
settings.register_profile('tff_clip', derandomize=True, deadline=None,
                          print_blob=True)
settings.load_profile('tff_clip')


@pytest.fixture(scope='session', autouse=True)
def tff_context():
  from tff_clip.runtime import execution  # pylint: disable=g-import-not-at-top
  execution.set_local_cpp_context()
  yield
