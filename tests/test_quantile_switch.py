"""The default's quantile switch: the median until round 20, then 0.1 if the
released norm has doubled since round 10 (`noise_following.QuantileSwitch`).

Oracles: the closed form of Andrew et al.'s geometric update with exact
counts (every norm above C: C_t = C_0 exp(eta gamma t); every norm below:
C_t = C_0 exp(-eta (1 - gamma) t)), and the DP events of the same query
without the switch (post-processing must not change them).
"""

import collections
import json
import math

import numpy as np
import pytest
import tensorflow as tf

from tff_clip.aggregation import dp
from tff_clip.aggregation import noise_following
from tff_clip.aggregation.spec import DPSpec

ETA = 0.2
C0 = 0.1
DEFAULT = noise_following.QuantileSwitch(
    noise_following.SWITCH_REFERENCE_ROUND, noise_following.SWITCH_ROUND,
    noise_following.SWITCH_GROWTH, noise_following.LOW_QUANTILE)


def _estimator(switch, count_stddev=None, seed=None):
  return dp.CountQuantileEstimatorQuery(
      C0, target_quantile=0.5, learning_rate=ETA,
      below_estimate_stddev=count_stddev, expected_num_records=4,
      geometric_update=True, noise_seed=seed, switch=switch)


def _run(query, norm, rounds):
  """Rounds of four clients of update norm `norm`: (estimate, target
  quantile, event) after each."""
  state = query.initial_global_state()
  out = []
  for _ in range(rounds):
    params = query.derive_sample_params(state)
    sample = query.initial_sample_state()
    for _ in range(4):
      sample = query.accumulate_record(params, sample, tf.constant(norm))
    estimate, state, event = query.get_noised_result(sample, state)
    out.append((float(estimate), float(state.target_quantile), event))
  return out


def test_the_rule_is_the_median_moving_to_0_1_at_round_20_on_doubling():
  assert DEFAULT == noise_following.QuantileSwitch(
      reference_round=10, at_round=20, growth=2.0, quantile=0.1)


def test_norms_that_run_away_move_the_quantile_after_round_20():
  # Every norm above C: C_t = C_0 e^{0.1 t}, so C_20 / C_10 = e > 2.
  rounds = _run(_estimator(DEFAULT), 1e3, 22)
  for t in range(1, 21):
    assert rounds[t - 1][0] == pytest.approx(C0 * math.exp(0.1 * t),
                                             rel=1e-5)
  assert [q for _, q, _ in rounds[:19]] == [0.5] * 19
  assert rounds[19][1] == pytest.approx(0.1)  # Tracked from round 21 on.
  # Round 21 tracks 0.1: C grows by e^{eta * 0.1} only.
  assert rounds[20][0] == pytest.approx(C0 * math.exp(2.0 + 0.02), rel=1e-5)
  assert rounds[21][0] == pytest.approx(C0 * math.exp(2.0 + 0.04), rel=1e-5)


def test_norms_that_settle_keep_the_median():
  # Every norm below C: C falls, C_20 / C_10 = e^{-1} < 2.
  rounds = _run(_estimator(DEFAULT), 0.0, 40)
  assert {q for _, q, _ in rounds} == {0.5}
  assert rounds[-1][0] == pytest.approx(C0 * math.exp(-0.1 * 40), rel=1e-5)


@pytest.mark.parametrize('growth, moves', [(math.e * (1 - 1e-4), True),
                                           (math.e * (1 + 1e-4), False)])
def test_the_switch_compares_the_growth_with_its_threshold(growth, moves):
  switch = noise_following.QuantileSwitch(10, 20, growth, 0.1)
  final_quantile = _run(_estimator(switch), 1e3, 20)[-1][1]
  assert final_quantile == pytest.approx(0.1 if moves else 0.5)


def test_the_switch_costs_no_privacy_its_events_are_those_without_it():
  with_switch = _run(_estimator(DEFAULT, count_stddev=0.5, seed=3), 1e3, 24)
  without = _run(_estimator(None, count_stddev=0.5, seed=3), 1e3, 24)
  assert [e for _, _, e in with_switch] == [e for _, _, e in without]
  # It moved (the run is one where it acts), and before it the two agree.
  assert with_switch[-1][1] == pytest.approx(0.1)
  np.testing.assert_allclose([c for c, _, _ in with_switch[:20]],
                             [c for c, _, _ in without[:20]], rtol=1e-6)


def test_a_switch_reads_one_norm_not_per_layer_estimates():
  with pytest.raises(ValueError, match='one norm'):
    dp.CountQuantileEstimatorQuery(
        np.full([2], C0, np.float32), 0.5, ETA, None, 4, switch=DEFAULT)


@pytest.mark.parametrize('fields, name', [
    (dict(reference_round=0), 'reference_round'),
    (dict(at_round=10), 'at_round'),
    (dict(growth=0.0), 'growth'),
    (dict(quantile=1.5), 'quantile')])
def test_a_bad_switch_is_refused_naming_the_field(fields, name):
  kwargs = dict(reference_round=10, at_round=20, growth=2.0, quantile=0.1)
  kwargs.update(fields)
  with pytest.raises(ValueError, match=name):
    noise_following.QuantileSwitch(**kwargs)


# d = 7,850 and n = 100: r = z sqrt(d) / n = 0.886 z.
D, N = 7850, 100.0


@pytest.mark.parametrize('spec, switch', [
    (dict(noise_multiplier=1.12), DEFAULT),  # r = 0.99: the median.
    (dict(noise_multiplier=1.12, bounding_method='normalize'), DEFAULT),
    (dict(noise_multiplier=1.7), None),  # r = 1.51: 0.1 from the start.
    (dict(noise_multiplier=0.0), None),  # No noise.
    (dict(noise_multiplier=1.12, target_quantile=0.5), None),  # Given.
    (dict(noise_multiplier=1.12, clip_norm=0.5), None),  # Fixed norm.
    (dict(noise_multiplier=1.12, bounding_method='per_layer_clip'), None),
    (dict(noise_multiplier=1.12, bounding_method='per_layer_clip',
          per_layer_quantiles=False), DEFAULT),  # One norm, split.
])
def test_only_a_quantile_that_follows_the_noise_at_the_median_switches(
    spec, switch):
  fields = collections.OrderedDict(bounding_method='noise_following',
                                   clients_per_round=N)
  fields.update(spec)
  assert noise_following.resolve(DPSpec(**fields), D).quantile_switch == (
      switch)


def test_the_released_target_quantile_moves_in_the_aggregator():
  """tff_clip's default factory at r = z sqrt(d) / n = 0.01 * 10 / 4 (the
  median), four updates of norm 1e3 a round, count noise 0.02 (0.005 on the
  fraction below C). Each round reports the state it leaves (the C and the
  quantile of the next round): the median through round 19, then 0.1, and C
  follows the closed form to within the count noise."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  process = dp.dp_factory('noise_following', noise_multiplier=0.01,
                          clients_per_round=4, clipped_count_stddev=0.02,
                          noise_seed=1).create(
                              tff.TensorType(np.float32, [100]))
  update = np.zeros([100], np.float32)
  update[0] = 1e3
  state = process.initialize()
  quantiles, norms = [], []
  for _ in range(22):
    output = process.next(state, [update] * 4)
    state = output.state
    metrics = output.measurements['dp_query_metrics']
    quantiles.append(float(metrics['target_quantile']))
    norms.append(float(metrics['clip_norm']))
  assert quantiles[:19] == [0.5] * 19
  assert quantiles[19:] == pytest.approx([0.1] * 3)
  # The norm after round t: C_0 e^{0.1 t} through round 20.
  assert norms[19] == pytest.approx(C0 * math.exp(2.0), rel=0.02)
  assert norms[20] / norms[19] == pytest.approx(math.exp(0.02), rel=0.005)


def test_a_run_releases_the_quantile_each_round_and_where_it_ended(tmp_path):
  """The training program with the default (digits' MLP, d = 2,410; z = 0.05,
  n = 6: r = 0.41, the median), starting from C = 1e-3, far below every
  update's norm: C grows e^{0.1} a round, more than doubles from round 10 to
  20, and the run moves to 0.1. metrics.csv releases the quantile of every
  round; the summary the one it started from and the one it ended at.
  A private run draws its cohorts and noise in secret, so where C stands at
  round 20 varies run to run (a cohort holding a client of small updates
  slows it); --noise_seed pins both, as a reproducible run does."""
  import csv  # pylint: disable=g-import-not-at-top
  from scripts import program  # pylint: disable=g-import-not-at-top
  from tff_clip.program import training  # pylint: disable=g-import-not-at-top
  config = training.TrainConfig(
      root_output_dir=str(tmp_path), experiment_name='switch', rounds=21,
      clients_per_round=6, noise_multiplier=0.05, initial_clip_norm=1e-3,
      eval_every=21, seed=3, noise_seed=3, progress=False)
  summary = program.run(config)
  assert summary['target_quantile'] == 0.5
  assert summary['final_target_quantile'] == pytest.approx(0.1)
  with open(tmp_path / 'switch' / 'metrics.csv') as f:
    quantiles = [float(row['target_quantile']) for row in csv.DictReader(f)]
  assert quantiles[:19] == [0.5] * 19
  assert quantiles[19:] == pytest.approx([0.1, 0.1])
  resolved = json.loads((tmp_path / 'switch' / 'config.json').read_text())[
      'resolved']
  assert resolved['quantile_switch'] == dict(reference_round=10, at_round=20,
                                             growth=2.0, quantile=0.1)


def test_a_quantile_given_releases_what_it_released_before():
  """No switch (a quantile given): the round reports no target quantile, so
  such a run's released rows are those of a tff_clip without the switch."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  process = dp.dp_factory('clip', noise_multiplier=0.01, clients_per_round=4,
                          target_quantile=0.5, noise_seed=1).create(
                              tff.TensorType(np.float32, [100]))
  output = process.next(process.initialize(), [np.ones([100], np.float32)])
  metrics = output.measurements['dp_query_metrics']
  assert 'clip_norm' in metrics and 'target_quantile' not in metrics
