"""Specification of the privacy CLI (`python -m scripts.accountant`).

Oracle: dp_accounting, composed here (the Poisson-sampled Gaussian
`rounds` times; RDP at dp_accounting's default orders, PLD on its default
1e-4 grid), never `tff_clip.privacy.accounting`. A figure printed to d digits must
be the oracle's to half a unit of its last digit.
"""

import decimal
import math
import os
import pathlib
import re
import subprocess
import sys

import dp_accounting
import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# The README example: 5000 rounds of z = 1, 100 of 10,000 clients.
EXAMPLE = ['--noise_multiplier=1.0', '--clients_per_round=100',
           '--population_size=10000', '--rounds=5000', '--delta=1e-6']


def _run(*flags):
  return subprocess.run(
      [sys.executable, '-m', 'scripts.accountant', *flags],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
      env={**os.environ, 'PYTHONPATH': str(REPO_ROOT)}, check=False)


@pytest.fixture(scope='module')
def example_with_extrapolation():
  return _run(*EXAMPLE, '--extrapolate')


def _poisson_gaussian(q, noise_multiplier, rounds, delta):
  """(RDP epsilon, its order, PLD epsilon) of the Poisson-sampled Gaussian
  composed `rounds` times, by dp_accounting."""
  event = dp_accounting.PoissonSampledDpEvent(
      q, dp_accounting.GaussianDpEvent(noise_multiplier))
  rdp = dp_accounting.rdp.RdpAccountant()
  rdp.compose(event, rounds)
  epsilon, order = rdp.get_epsilon_and_optimal_order(delta)
  pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  pld.compose(event, rounds)
  return epsilon, order, pld.get_epsilon(delta)


def _rdp_epsilon(q, noise_multiplier, rounds, delta):
  rdp = dp_accounting.rdp.RdpAccountant()
  rdp.compose(dp_accounting.PoissonSampledDpEvent(
      q, dp_accounting.GaussianDpEvent(noise_multiplier)), rounds)
  return rdp.get_epsilon_and_optimal_order(delta)


def _assert_printed(text, value):
  """`text` is `value` rounded to its last printed digit."""
  half_unit = 0.5 * 10.0**decimal.Decimal(text).as_tuple().exponent
  assert abs(float(text) - value) <= half_unit * (1 + 1e-9), (text, value)


def _figure(pattern, stdout):
  match = re.search(pattern, stdout)
  assert match, (pattern, stdout)
  return match.group(1)


def test_cli_prints_dp_accountings_epsilon_of_both_accountants(
    example_with_extrapolation):
  result = example_with_extrapolation
  assert result.returncode == 0, result.stderr
  rdp, order, pld = _poisson_gaussian(0.01, 1.0, 5000, 1e-6)

  _assert_printed(_figure(r'RDP epsilon = ([\d.]+)', result.stdout), rdp)
  assert float(_figure(r'optimal RDP order ([\d.]+)', result.stdout)) == order
  # PLD: an upper bound on a coarser grid (1e-4 x epsilon): at least the
  # fine grid's bound, and within 0.1% of it.
  printed = float(_figure(r'PLD epsilon = ([\d.]+)', result.stdout))
  assert pld * (1 - 1e-4) <= printed <= pld * (1 + 1e-3)
  assert (round(rdp, 2), round(pld, 2)) == (5.11, 4.74)  # docs/privacy.md


def test_cli_extrapolate_prints_the_population_table(
    example_with_extrapolation):
  """One row per scale pair (a, b): n = 100 a clients of K = 10,000 b, the
  noise z = a keeping z / n fixed; each RDP figure is dp_accounting's."""
  lines = example_with_extrapolation.stdout.splitlines()
  header = next(i for i, line in enumerate(lines) if 'K (population)' in line)

  assert re.split(r'\s{2,}', lines[header].strip()) == [
      'n (clients/round)', 'K (population)', 'q', 'z', 'RDP epsilon',
      'RDP order', 'PLD epsilon']
  rows = lines[header + 1:]
  scales = [(1, 1), (10, 10), (100, 100), (100, 1000), (100, 10000)]
  assert len(rows) == len(scales)
  for row, (a, b) in zip(rows, scales):
    n, population, q, z, rdp, order, _ = row.split()
    assert (n, population) == (f'{100 * a:,}', f'{10_000 * b:,}')
    expected_q = 100 * a / (10_000 * b)
    _assert_printed(q, expected_q)
    _assert_printed(z, a)
    epsilon, expected_order = _rdp_epsilon(expected_q, a, 5000, 1e-6)
    _assert_printed(rdp, epsilon)
    assert float(order) == expected_order


def test_cli_target_epsilon_calibrates_the_noise_multiplier():
  """The printed z meets the target by dp_accounting, and 0.1% less noise
  would not: it is the smallest such z to 1e-3."""
  target = 5.1132
  result = _run(f'--target_epsilon={target}', '--clients_per_round=100',
                '--population_size=10000', '--rounds=5000', '--delta=1e-6',
                '--accountants=rdp')

  assert result.returncode == 0, result.stderr
  printed = _figure(r'noise_multiplier = ([\d.]+)  gives', result.stdout)
  z = float(printed)
  # z was rounded to the printed digits; the calibrated one is at most half
  # a unit larger, and more noise gives less epsilon.
  half_unit = 0.5 * 10.0**decimal.Decimal(printed).as_tuple().exponent
  assert _rdp_epsilon(0.01, z + half_unit, 5000, 1e-6)[0] <= target
  assert _rdp_epsilon(0.01, z * (1 - 1e-3), 5000, 1e-6)[0] > target
  assert z == pytest.approx(1.0, abs=1e-5)


def _gaussian_epsilon(mu, delta):
  """Epsilon of the Gaussian mechanism of sensitivity/std `mu` at `delta`
  (Balle and Wang 2018, Thm. 8): the root of
  delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
  from scipy import optimize, stats  # pylint: disable=g-import-not-at-top
  gap = lambda eps: (stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) *
                     stats.norm.cdf(-eps / mu - mu / 2)) - delta
  return optimize.brentq(gap, 0.0, 100.0, xtol=1e-14)


@pytest.mark.parametrize('flags, pattern, epsilon_of', [
    # 100 of 10,000 for 100 rounds, RDP: calibrated z = 1.0801933 was
    # printed 1.080193, whose epsilon is 1.0000006.
    (['--target_epsilon=1', '--clients_per_round=100',
      '--population_size=10000', '--rounds=100', '--delta=1e-5',
      '--accountants=rdp'],
     r'noise_multiplier = ([\d.]+)  gives',
     lambda z: _rdp_epsilon(0.01, z, 100, 1e-5)[0]),
    # Independent noise, 10 rounds, separation 5: two Gaussians of z, one
    # of z / sqrt(2). Calibrated z = 1.52899375 was printed 1.52899, whose
    # epsilon is 4.0000113.
    (['--target_epsilon=4', '--clients_per_round=10',
      '--population_size=100', '--rounds=10', '--delta=1e-5',
      '--sampling=min_separation', '--min_separation=5'],
     r'noise_multiplier = ([\d.]+), independent',
     lambda z: _gaussian_epsilon(math.sqrt(2) / z, 1e-5)),
])
def test_cli_target_epsilon_prints_a_noise_multiplier_that_meets_it(
    flags, pattern, epsilon_of):
  """The z printed for --target_epsilon is what a user trains with: its own
  epsilon (dp_accounting's RDP; the Gaussian's closed form) is at most the
  target, not only that of the unprinted digits behind it."""
  result = _run(*flags)

  assert result.returncode == 0, result.stderr
  printed = float(_figure(pattern, result.stdout))
  target = float(flags[0].split('=')[1])
  assert epsilon_of(printed) <= target
  assert epsilon_of(printed * (1 - 1e-4)) > target  # And no looser.


def test_cli_fixed_size_sampling_reports_pld_as_unavailable():
  result = _run('--noise_multiplier=1.0', '--clients_per_round=100',
                '--population_size=10000', '--rounds=100', '--delta=1e-6',
                '--sampling=fixed_size')

  assert result.returncode == 0, result.stderr
  assert 'replace-one' in result.stdout
  assert 'PLD epsilon = n/a' in result.stdout
  # dp_accounting: 100 of 10,000 without replacement, replace-one adjacency,
  # where one client's update moves the sum by up to 2 C (the Gaussian's z
  # halves; google/differential-privacy#378).
  rdp = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  rdp.compose(dp_accounting.SampledWithoutReplacementDpEvent(
      10_000, 100, dp_accounting.GaussianDpEvent(0.5)), 100)
  epsilon, order = rdp.get_epsilon_and_optimal_order(1e-6)
  _assert_printed(_figure(r'RDP epsilon = ([\d.]+)', result.stdout), epsilon)
  assert float(_figure(r'optimal RDP order ([\d.]+)', result.stdout)) == order


def test_cli_bad_input_fails_naming_the_argument():
  result = _run(*EXAMPLE[:-1], '--delta=1.5')

  assert result.returncode != 0
  assert '`delta` must be in (0, 1); got 1.5' in result.stderr
  assert result.stdout == ''


@pytest.mark.parametrize('args, name', [
    ([*EXAMPLE[:-1], '--delta=1.5'], 'delta'),
    ([*EXAMPLE, '--accountant=rdp'], 'accountant'),
    ([*EXAMPLE, '--rounds=many'], 'rounds'),
    # Correlated noise is accounted under minimum separation only: under
    # Poisson the figure would be independent noise's, not banded noise's.
    ([*EXAMPLE, '--noise_mechanism=banded', '--bands=4'], 'noise_mechanism'),
    ([*EXAMPLE, '--min_separation=4'], 'min_separation'),
    # More groups than clients: the separation is at fault (its groups
    # would be empty), not the cohort, which cannot be "at most 0".
    ([*EXAMPLE, '--sampling=min_separation', '--noise_mechanism=banded',
      '--bands=4', '--min_separation=20000'], '--min_separation (20000)'),
    # The separation defaults to --bands: a bad one is named as given.
    ([*EXAMPLE, '--sampling=min_separation', '--noise_mechanism=banded',
      '--bands=0'], '--bands'),
    ([*EXAMPLE, '--extrapolate_cohort_scales=1,2'],
     'extrapolate_cohort_scales'),
    # A PLD grid no PLD figure reads: RDP only, or fixed-size sampling
    # (PLD n/a).
    ([*EXAMPLE, '--accountants=rdp',
      '--pld_value_discretization_interval=0.01'],
     'pld_value_discretization_interval'),
    ([*EXAMPLE, '--sampling=fixed_size',
      '--pld_value_discretization_interval=0.01'],
     'pld_value_discretization_interval'),
    # Look-alike digits and underscores, as every numeric flag: float()
    # reads the Arabic-Indic '١' as 1 and '1_0' as 10.
    ([*EXAMPLE, '--extrapolate',
      '--extrapolate_cohort_scales=١,10,100,100,100'],
     'extrapolate_cohort_scales'),
    ([*EXAMPLE, '--extrapolate',
      '--extrapolate_population_scales=1_0,10,100,1000,10000'],
     'extrapolate_population_scales'),
    # A figure printed twice, a cohort no minimum-separation round takes, a
    # table with no epsilon column (PLD cannot do fixed-size sampling).
    ([*EXAMPLE, '--accountants=rdp,RDP'], 'accountants'),
    ([*EXAMPLE[:1], '--clients_per_round=10.5', *EXAMPLE[2:],
      '--sampling=min_separation', '--bands=5'], 'clients_per_round'),
    ([*EXAMPLE, '--sampling=fixed_size', '--accountants=pld', '--extrapolate'],
     'extrapolate'),
])
def test_cli_bad_flag_is_one_line_with_exit_code_2(args, name):
  result = _run(*args)
  assert result.returncode == 2
  assert result.stderr.startswith('error: ') and name in result.stderr
  assert result.stderr.count('\n') == 1, result.stderr
  assert result.stdout == ''
