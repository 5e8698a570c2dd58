"""The default target quantile follows the noise: a rule of public numbers.

`noise_following.noise_following_quantile(z, n, d)` is 0.7 where the noise on the
mean update, z C sqrt(d) / n, is at most 0.9 C, 0.1 where it is at least
1.6 C, and log-linear between (docs/frontier.md, "A default that follows the
noise"). The oracles: the rule's closed form at its anchors and midpoint
(the geometric mean sqrt(0.7 x 0.1)), TFF's own `gaussian_adaptive` at the
quantile the rule gives, and TFF's signature for its baselines' default.
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
    (0.0, 0.7), (0.5, 0.7), (0.9, 0.7),  # Little noise: most kept whole.
    (1.25, math.sqrt(0.7 * 0.1)),  # Midway in r: the geometric mean.
    (1.6, 0.1), (3.0, 0.1), (100.0, 0.1)])  # Noise dominates: C small.
def test_the_rule_at_its_anchors_and_midway(ratio, quantile):
  assert _quantile(ratio) == pytest.approx(quantile, rel=1e-12)


def test_more_noise_never_raises_the_quantile():
  ratios = [0.1 * k for k in range(31)]
  quantiles = [_quantile(r) for r in ratios]
  assert all(a >= b for a, b in zip(quantiles, quantiles[1:]))
  assert quantiles[0] > quantiles[-1]
  # The same z: a larger model, or a smaller cohort, is more noise per C.
  assert (noise_following.noise_following_quantile(1.0, 50, 7850) <
          noise_following.noise_following_quantile(1.0, 50, 2410) <
          noise_following.noise_following_quantile(1.0, 100, 2410))


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
  assert spec.DPSpec(**base, target_quantile=0.9).quantile_for(100) == 0.9
  assert spec.DPSpec(**base, target_quantile=0.0).quantile_for(100) == 0.0
  # z sqrt(d) / n = 1 x 10 / 8 = 1.25: midway.
  assert spec.DPSpec(**base).quantile_for(100) == pytest.approx(
      math.sqrt(0.07), rel=1e-12)


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
