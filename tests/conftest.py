"""Shared test set-up: one C++ execution context per test session.

The context is tff_clip's (`tff_clip.runtime.execution.set_local_cpp_context`), whose
worker process dies with the test process, so no TFF worker outlives pytest.
Under pytest-xdist (`make test`) each worker process has its own; the
controlling process runs no test and never imports TensorFlow.

Hypothesis is derandomized (the 'tff_clip' settings profile).

`dp_accounting_builds_each_round_once`: for tests whose oracle is
dp_accounting's PLD accountant asked about the same few rounds many times.
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


class _EachGaussianBuiltOnce:
  """dp_accounting's `privacy_loss_distribution` module as its PLD
  accountant sees it, with `from_gaussian_mechanism` (a pure function)
  answering from the PLDs it built before in this process: the same
  objects, so the same bits."""

  _built = {}

  def __init__(self, module):
    self._module = module

  def __getattr__(self, name):
    return getattr(self._module, name)

  def from_gaussian_mechanism(self, *args, **kwargs):
    key = (args, tuple(sorted(kwargs.items())))
    if key not in self._built:
      self._built[key] = self._module.from_gaussian_mechanism(*args, **kwargs)
    return self._built[key]


@pytest.fixture
def dp_accounting_builds_each_round_once(monkeypatch):
  """dp_accounting's PLD accountant (`pld.PLDAccountant`, an oracle) builds
  each round's PLD once per process instead of afresh for every event it
  composes (seconds each on a fine grid). The project's accountant never
  goes through it for a (sampled) Gaussian round: its own `_PldAccountant`
  builds those (`tff_clip.privacy.pld_numpy`)."""
  from dp_accounting.pld import pld_privacy_accountant  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(pld_privacy_accountant, 'PLD', _EachGaussianBuiltOnce(
      pld_privacy_accountant.PLD))
