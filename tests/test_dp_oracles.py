"""`dp.dp_factory` with the noise off equals TFF's own DP factories.

TFF's `DifferentiallyPrivateFactory.gaussian_fixed` and `gaussian_adaptive`
(tensorflow-privacy's Gaussian sum query and quantile estimator, Andrew et al.
2021) are the oracle for global clipping: with noise_multiplier = 0 and no
count noise, both must return the same mean (the clipped sum over
clients_per_round) and move the clip norm through the same values.
"""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_clip.aggregation import dp

VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    kernel=(np.float32, [2, 2]), bias=(np.float32, [2])))


def _update(kernel, bias):
  return collections.OrderedDict(kernel=np.asarray(kernel, np.float32),
                                 bias=np.asarray(bias, np.float32))


# Global norms 5, 0.5 and sqrt(5): clipped at 1, the first and third shrink.
CLIENTS = [
    _update([[4.0, 0.0], [0.0, 0.0]], [3.0, 0.0]),
    _update([[0.3, 0.0], [0.0, 0.4]], [0.0, 0.0]),
    _update([[0.0, 1.0], [0.0, 0.0]], [0.0, 2.0]),
]
CLIENTS_PER_ROUND = 3.0
_ROUNDS = 3

_U = 2.0**-24  # float32 unit roundoff.
# Our bound aims a hair below C (bounding.rounding_margins: 10 u + 1e-9); TFF
# clips at C. The sum of three clipped records and the division by n add at
# most 3 u, the clip factors 2 u each side: 10 u + 1e-9 + 8 u.
_RESULT_RTOL = 18 * _U + 1e-9
# Both sides run tensorflow-privacy's geometric update on the same counts; the
# float32 products and exp differ by at most a few u per round.
_NORM_RTOL = 4 * _ROUNDS * _U


def _run(process):
  state = process.initialize()
  outputs = []
  for _ in range(_ROUNDS):
    output = process.next(state, CLIENTS)
    state = output.state
    outputs.append(output)
  return outputs


@pytest.fixture(scope='module')
def fixed_runs():
  ours = dp.dp_factory('clip', noise_multiplier=0.0,
                       clients_per_round=CLIENTS_PER_ROUND, clip_norm=1.0)
  tffs = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=CLIENTS_PER_ROUND, clip=1.0)
  return _run(ours.create(VALUE_TYPE)), _run(tffs.create(VALUE_TYPE))


@pytest.fixture(scope='module')
def adaptive_runs():
  ours = dp.dp_factory('clip', noise_multiplier=0.0,
                       clients_per_round=CLIENTS_PER_ROUND,
                       clip_norm='adaptive', initial_clip_norm=0.1,
                       target_quantile=0.5, clip_learning_rate=0.2)
  tffs = tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
      noise_multiplier=0.0, clients_per_round=CLIENTS_PER_ROUND,
      initial_l2_norm_clip=0.1, target_unclipped_quantile=0.5,
      learning_rate=0.2, clipped_count_stddev=0.0)
  return _run(ours.create(VALUE_TYPE)), _run(tffs.create(VALUE_TYPE))


def _assert_results_close(ours, tffs):
  for our_output, tff_output in zip(ours, tffs):
    for key in ('kernel', 'bias'):
      np.testing.assert_allclose(our_output.result[key],
                                 tff_output.result[key], rtol=_RESULT_RTOL,
                                 atol=0)  # Zero entries stay exactly zero.


def test_fixed_clip_without_noise_is_tff_gaussian_fixed(fixed_runs):
  _assert_results_close(*fixed_runs)


def test_adaptive_clip_without_noise_is_tff_gaussian_adaptive(adaptive_runs):
  _assert_results_close(*adaptive_runs)


def test_adaptive_clip_norm_follows_tff_gaussian_adaptive(adaptive_runs):
  ours, tffs = adaptive_runs
  our_norms = [float(o.measurements['dp_query_metrics']['clip_norm'])
               for o in ours]
  tff_norms = [float(o.measurements['dp_query_metrics']['clip'])
               for o in tffs]
  np.testing.assert_allclose(our_norms, tff_norms, rtol=_NORM_RTOL)
  # All three norms exceed C (0.1 < 0.5 < sqrt(5) < 5), so C grows by
  # exp(eta * gamma) = exp(0.1) each round (Andrew et al. 2021, Eq. (2)).
  np.testing.assert_allclose(our_norms, 0.1 * np.exp(0.1 * np.arange(1, 4)),
                             rtol=_NORM_RTOL)


@pytest.fixture(scope='module')
def default_quantile_runs():
  # tff_clip's default bounding and quantile without noise: clipping at the
  # median, which is TFF's gaussian_adaptive at its own defaults.
  ours = dp.dp_factory('noise_following', noise_multiplier=0.0,
                       clients_per_round=CLIENTS_PER_ROUND,
                       clip_norm='adaptive', initial_clip_norm=0.1,
                       clip_learning_rate=0.2)
  tffs = tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
      noise_multiplier=0.0, clients_per_round=CLIENTS_PER_ROUND,
      clipped_count_stddev=0.0)
  return _run(ours.create(VALUE_TYPE)), _run(tffs.create(VALUE_TYPE))


def test_default_without_noise_is_tff_gaussian_adaptive_at_its_defaults(
    default_quantile_runs):
  ours, tffs = default_quantile_runs
  _assert_results_close(ours, tffs)
  our_norms = [float(o.measurements['dp_query_metrics']['clip_norm'])
               for o in ours]
  # All three norms exceed C: C grows by exp(eta gamma) = exp(0.2 x 0.5).
  np.testing.assert_allclose(our_norms, 0.1 * np.exp(0.1 * np.arange(1, 4)),
                             rtol=_NORM_RTOL)


@pytest.mark.parametrize('ratio, quantile', [(1.1, 0.5), (1.25, 0.1)])
def test_default_quantile_is_read_from_the_updates_size_and_the_noise(
    ratio, quantile):
  # d = 6 (VALUE_TYPE), n = 3: z sqrt(6) / 3 = ratio at z = ratio x 3 /
  # sqrt(6); the rule's switch from the median to 0.1 is at 1.15.
  z = ratio * CLIENTS_PER_ROUND / np.sqrt(6)
  process = dp.dp_factory('normalize', noise_multiplier=z,
                          clients_per_round=CLIENTS_PER_ROUND,
                          clip_norm='adaptive').create(VALUE_TYPE)
  estimator = process.initialize().query_state.numerator_state.estimator_state
  assert float(estimator.target_quantile) == pytest.approx(quantile,
                                                           rel=2**-23)
