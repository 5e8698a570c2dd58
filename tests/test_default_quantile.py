"""tff_clip's default bounding and quantile follow the noise: public numbers.

From r = z sqrt(d) / n, the norm of the noise on the mean update in units
of C (docs/frontier_history_2.md, "A default that follows the noise"):
`noise_following_quantile` is the median (0.5) below r = 1.15, 0.1 from
there and 0.03 from r = 2; `noise_following_bounding` clips below r = 1.6
and normalizes from it on. The oracles: the rule's values on both sides of
its three switches, the bounding TFF's own factories apply (clipping:
`gaussian_adaptive`'s), and TFF's signature for its baselines' default.
"""

import ast
import importlib.util
import math
import pathlib

import pytest

from tff_clip.aggregation import noise_following
from tff_clip.aggregation import spec


def _quantile(ratio, n=50, d=10_000):
  """The rule at noise-to-bound ratio `ratio` (z = ratio n / sqrt(d))."""
  return noise_following.noise_following_quantile(ratio * n / math.sqrt(d), n, d)


def test_the_ratio_is_the_norm_of_the_noise_on_the_mean_in_units_of_c():
  # N(0, (z C)^2 I_d) on the sum, divided by n: norm z C sqrt(d) / n.
  assert noise_following.noise_to_bound_ratio(1.5, 60, 1600) == 1.5 * 40 / 60
  assert noise_following.noise_to_bound_ratio(0.0, 60, 1600) == 0.0


@pytest.mark.parametrize('ratio, quantile', [
    (0.0, 0.5), (0.5, 0.5), (1.149, 0.5),  # Little noise: the median.
    # From 1.15 on, whether clipped or normalized, C tracks 0.1.
    (1.15, 0.1), (1.25, 0.1), (1.599, 0.1),
    (1.6, 0.1), (1.999, 0.1),
    # From 2 on the noise dominates: C smaller still.
    (2.0, 0.03), (3.0, 0.03), (100.0, 0.03)])
def test_the_quantile_is_the_median_then_0_1_then_0_03_as_the_noise_grows(
    ratio, quantile):
  assert _quantile(ratio) == quantile


@pytest.mark.parametrize('ratio, bounding', [
    (0.0, 'clip'), (1.0, 'clip'), (1.15, 'clip'), (1.599, 'clip'),
    (1.6, 'normalize'), (2.3, 'normalize'), (100.0, 'normalize')])
def test_the_bounding_clips_below_the_switch_and_normalizes_from_it(
    ratio, bounding):
  n, d = 50, 10_000
  z = ratio * n / math.sqrt(d)
  assert noise_following.noise_following_bounding(z, n, d) == bounding
  # The registered default resolves to the same bounding object.
  from tff_clip.aggregation import mechanisms  # pylint: disable=g-import-not-at-top
  resolved = mechanisms.bounding('noise_following').resolve(z, n, d)
  assert resolved.name == bounding
  # Every other bounding stays what it is named, at any noise.
  assert mechanisms.bounding('normalize').resolve(0.0, n, d).name == (
      'normalize')
  assert mechanisms.bounding('clip').resolve(z * 100, n, d).name == 'clip'


def test_more_noise_never_raises_the_quantile():
  ratios = [0.1 * k for k in range(31)]
  quantiles = [_quantile(r) for r in ratios]
  assert all(a >= b for a, b in zip(quantiles, quantiles[1:]))
  assert quantiles[0] > quantiles[-1]
  # The same z: a larger model, or a smaller cohort, is more noise per C.
  # r = 1.47 and 0.74.
  assert (noise_following.noise_following_quantile(1.5, 50, 2410) <
          noise_following.noise_following_quantile(1.5, 100, 2410))


@pytest.mark.parametrize('argument, z, n, d', [
    ('noise_multiplier', -0.5, 50, 100), ('noise_multiplier', math.nan, 50, 100),
    ('clients_per_round', 1.0, 0, 100), ('dimension', 1.0, 50, 0),
    ('dimension', 1.0, 50, 2.5)])
def test_bad_input_is_refused_naming_the_argument(argument, z, n, d):
  with pytest.raises((TypeError, ValueError), match=f'`{argument}`'):
    noise_following.noise_following_quantile(z, n, d)


def test_a_given_quantile_is_kept_and_none_follows_the_noise():
  base = dict(bounding_method='normalize', noise_multiplier=1.0,
              clients_per_round=8, clip_norm='adaptive')
  def quantile(dimension, **fields):
    return noise_following.resolve(spec.DPSpec(**base, **fields),
                        dimension).target_quantile

  assert quantile(100, target_quantile=0.9) == 0.9
  assert quantile(100, target_quantile=0.0) == 0.0
  # z sqrt(d) / n = 1 x 10 / 8 = 1.25: past the switch, 0.1.
  assert quantile(100) == 0.1
  # 1 x 20 / 8 = 2.5: past the second switch, 0.03.
  assert quantile(400) == 0.03
  # 1 x 8 / 8 = 1: below the switch, the median.
  assert quantile(64) == 0.5
  # A fixed clip norm tracks no quantile.
  assert noise_following.resolve(spec.DPSpec(**dict(base, clip_norm=1.0)),
                      100).target_quantile is None


def test_the_default_is_noise_following_and_the_run_records_what_it_chose():
  from tff_clip.program import config  # pylint: disable=g-import-not-at-top
  assert config.TrainConfig().bounding == 'noise_following'
  assert config.TrainConfig().target_quantile is None
  base = dict(bounding_method='noise_following', clients_per_round=8,
              clip_norm='adaptive')
  # z sqrt(d) / n = 1.6 x 10 / 8 = 2 >= 1.6, and 1 x 10 / 8 < 1.6.
  assert noise_following.resolve(spec.DPSpec(**base, noise_multiplier=1.6),
                      100).bounding == 'normalize'
  assert noise_following.resolve(spec.DPSpec(**base, noise_multiplier=1.0),
                      100).bounding == 'clip'


def _tff_default(function: str, argument: str):
  """The default of `argument` in TFF's `DifferentiallyPrivateFactory.function`."""
  tff = pathlib.Path(importlib.util.find_spec(
      'tensorflow_federated').submodule_search_locations[0])
  source = (tff / 'python/aggregators/differential_privacy.py').read_text()
  [method] = [node for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.FunctionDef) and node.name == function]
  names = [a.arg for a in method.args.args][-len(method.args.defaults):]
  return {name: ast.literal_eval(value) for name, value in
          zip(names, method.args.defaults)}[argument]


def test_tffs_baselines_keep_tffs_own_default_quantile():
  from tff_clip.program import assembly, config  # pylint: disable=g-import-not-at-top
  assert assembly.TFF_TARGET_QUANTILE == _tff_default(
      'gaussian_adaptive', 'target_unclipped_quantile')
  assert assembly.TFF_TARGET_QUANTILE == _tff_default(
      'tree_adaptive', 'target_unclipped_quantile')
  unset = config.TrainConfig(bounding='tff_gaussian', clip_norm='adaptive')
  assert unset.target_quantile is None
  assert assembly.baseline_quantile(unset) == assembly.TFF_TARGET_QUANTILE
  given = config.TrainConfig(bounding='tff_gaussian', clip_norm='adaptive',
                             target_quantile=0.2)
  assert assembly.baseline_quantile(given) == 0.2


@pytest.mark.parametrize('z, chosen', [(1.2, 'clip'), (1.7, 'normalize')])
def test_dp_factory_bounds_as_the_bounding_the_noise_chooses(z, chosen):
  """d = 16, n = 4: r = z sqrt(16) / 4 = z, so z = 1.2 clips and 1.7
  normalizes; the release equals that of the factory named so, same key."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tff_clip.aggregation import dp  # pylint: disable=g-import-not-at-top
  value_type = (np.float32, [16])
  clients = [np.full([16], 0.05, np.float32), np.full([16], 2.0, np.float32),
             np.zeros([16], np.float32), np.full([16], -0.1, np.float32)]

  def release(method):
    factory = dp.dp_factory(method, noise_multiplier=z, clients_per_round=4,
                            clip_norm=1.0, noise_seed=7)
    process = factory.create(value_type)
    return np.asarray(process.next(process.initialize(), clients).result)

  other = {'clip': 'normalize', 'normalize': 'clip'}[chosen]
  np.testing.assert_array_equal(release('noise_following'), release(chosen))
  assert not np.array_equal(release(chosen), release(other))
