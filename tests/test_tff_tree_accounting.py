"""TFF's tree baseline is accounted at the least z its float32 state runs.

`--bounding=tff_tree_adaptive` (TFF's restarted tree with adaptive
clipping) reports no DP events of its own: the ledger accounts each
participation as tff_clip's tree of the run's z. TFF splits z into the
value's and the clipped count's noise in float64
(`adaptive_clip_noise_params`), then tensorflow-privacy holds both in
float32, rounded to nearest: often a hair below. Oracle: dp_accounting's
RDP of the two float32 Gaussians TFF runs, against the ledger's event,
order by order (RDP composes by addition, so a participation that is at
least as private at every order keeps the whole run at least as private).
"""

import types

import dp_accounting
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_clip.aggregation import noise_following
from tff_clip.program import assembly
from tff_clip.program import training

N, BANDS = 20, 8
ORDERS = [1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 256.0]


def _rdp(event):
  return np.asarray(dp_accounting.rdp.RdpAccountant(ORDERS).compose(
      event)._rdp)  # pylint: disable=protected-access


def _what_tff_runs(z, levels):
  count_stddev = noise_following.default_clipped_count_stddev(z, N, 1)
  value_z, count_stddev = (
      tff.aggregators.differential_privacy.adaptive_clip_noise_params(
          z, N, count_stddev))
  # tensorflow-privacy's state: tf.cast(value_z, tf.float32), and the
  # count's std sigma_b (sensitivity 1/2: noise multiplier 2 sigma_b).
  value_z32 = float(np.float32(value_z))
  count_z32 = 2.0 * float(np.float32(count_stddev))
  return dp_accounting.ComposedDpEvent([
      dp_accounting.GaussianDpEvent(value_z32 / levels),
      dp_accounting.GaussianDpEvent(count_z32 / levels)])


def _ledger_event(z):
  config = training.TrainConfig(
      bounding='tff_tree_adaptive', clip_norm='adaptive', sampling=
      'min_separation', noise_mechanism='tree', bands=BANDS, rounds=64,
      clients_per_round=N, noise_multiplier=z)
  session = types.SimpleNamespace(config=config, noise_multiplier=z,
                                  population=N * BANDS)
  return assembly.Session.round_event(session, None, 1), config


@pytest.mark.parametrize('z', [0.5, 1.3, 1.5, 3.0, 0.7, 2.2])
def test_each_participation_is_accounted_no_more_private_than_it_ran(z):
  recorded, config = _ledger_event(z)
  levels = config.noise.participation_sensitivity
  assert np.all(_rdp(recorded) >= _rdp(_what_tff_runs(z, levels)))


def test_the_float32_state_is_below_the_given_z_at_some_z():
  # Why the slack: at z = 1.3 the float32 state runs less noise than z.
  config = _ledger_event(1.3)[1]
  levels = config.noise.participation_sensitivity
  at_z = config.noise.participation_event(1.3)
  assert np.any(_rdp(at_z) < _rdp(_what_tff_runs(1.3, levels)))
