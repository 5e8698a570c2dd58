r"""User-level (epsilon, delta) of DP federated training, from its DpEvents.

Epsilon of `rounds` rounds of sampled Gaussian noise, with the RDP accountant
(and its optimal order) and the PLD accountant:

  python -m scripts.accountant --noise_multiplier=1.0 --clients_per_round=100 \
      --population_size=10000 --rounds=5000 --delta=1e-6

The noise multiplier that meets a target epsilon:

  python -m scripts.accountant --target_epsilon=2 --clients_per_round=100 \
      --population_size=10000 --rounds=5000 --delta=1e-6

Population extrapolation (McMahan et al. 2018; Pelikan et al. 2025, Table 1): the same
noise on the average (sigma_DP = z / n) with a larger cohort and population:

  python -m scripts.accountant --noise_multiplier=1.0 --clients_per_round=100 \
      --population_size=10000 --rounds=5000 --delta=1e-6 --extrapolate

`--sampling` must be what the training loop does: `poisson` (each client
joins independently with probability q = clients_per_round / population_size;
add-or-remove-one adjacency) or `fixed_size` (exactly clients_per_round
distinct clients per round; replace-one adjacency, RDP only). See
`tff_clip/privacy/accounting.py` for what each number means.

Correlated noise under participation with minimum separation (each client
in at most one of every --min_separation rounds; no amplification): the
event is ceil(rounds / b) participations (`tff_clip.aggregation.correlated_noise`):

  python -m scripts.accountant --noise_multiplier=2.0 --clients_per_round=100 \
      --population_size=10000 --rounds=2000 --delta=1e-6 \
      --sampling=min_separation --noise_mechanism=banded --bands=100

Imports no TensorFlow, so it answers in about a second.

References:
* Pelikan et al. 2025: "Enabling Differentially Private Federated
  Learning for Speech Recognition", NeurIPS 2025.
"""

from __future__ import annotations

import decimal
import numbers
import sys

from absl import app
from absl import flags
import dp_accounting

from scripts import cli
from tff_clip import checks
from tff_clip.aggregation import mechanisms
from tff_clip.aggregation import spec
from tff_clip.privacy import accounting
from tff_clip.privacy import sampling as sampling_lib

_NOISE_MULTIPLIER = flags.DEFINE_float(
    'noise_multiplier', None,
    'Noise std / clip norm, on the sum of the clipped client updates.')
_TARGET_EPSILON = flags.DEFINE_float(
    'target_epsilon', None,
    'Instead of --noise_multiplier: find the smallest noise multiplier whose '
    'epsilon is <= this.')
_CLIENTS_PER_ROUND = flags.DEFINE_float(
    'clients_per_round', None,
    'Cohort size n: expected (may be fractional) for Poisson sampling, exact '
    'for fixed-size sampling.')
_POPULATION_SIZE = flags.DEFINE_integer(
    'population_size', None, 'Number of clients K sampled from.')
_ROUNDS = flags.DEFINE_integer('rounds', None,
                               'Number of training rounds (at most 100,000).')
_DELTA = flags.DEFINE_float('delta', None, 'Target delta, in (0, 0.01].')
_SAMPLING = flags.DEFINE_enum(
    'sampling', accounting.POISSON, list(accounting.SAMPLINGS),
    'How each cohort is drawn; must be what the training loop does.')
_NOISE_MECHANISM = flags.DEFINE_enum(
    'noise_mechanism', spec.parameter('noise_mechanism').default,
    list(mechanisms.NOISE_MECHANISMS),
    'With --sampling=min_separation: the noise mechanism (see --bands).')
_BANDS = flags.DEFINE_integer('bands', 1, 'Bands, or the tree restart period.')
_BLT_BUFFERS = flags.DEFINE_integer(
    'blt_buffers', spec.parameter('blt_buffers').default,
    'With --noise_mechanism=blt: the most buffers, as in '
    'training (its noise is optimized for --rounds and the separation).')
_MIN_SEPARATION = flags.DEFINE_integer(
    'min_separation', None,
    'With --sampling=min_separation: rounds between two participations of '
    'a client (default: --bands).')
_ACCOUNTANTS = flags.DEFINE_list(
    'accountants', list(accounting.ACCOUNTANTS),
    'Accountants to run: rdp, pld (PLD cannot do fixed-size sampling).')
_PLD_VALUE_DISCRETIZATION_INTERVAL = flags.DEFINE_float(
    'pld_value_discretization_interval', None,
    'PLD grid; default: 1e-4 x the RDP epsilon (see tff_clip.privacy.accounting).')
_EXTRAPOLATE = flags.DEFINE_bool(
    'extrapolate', False,
    'Also print the population extrapolation table (sigma_DP = z/n and the '
    'clip norm held fixed).')
_COHORT_SCALES = flags.DEFINE_list(
    'extrapolate_cohort_scales',
    [str(a) for a, _ in accounting.DEFAULT_EXTRAPOLATION_SCALES],
    'Factors on clients_per_round, one per table row.')
_POPULATION_SCALES = flags.DEFINE_list(
    'extrapolate_population_scales',
    [str(b) for _, b in accounting.DEFAULT_EXTRAPOLATION_SCALES],
    'Factors on population_size, one per table row.')

flags.mark_flags_as_required(
    ['clients_per_round', 'population_size', 'rounds', 'delta'])


def _clients_per_round():
  value = _CLIENTS_PER_ROUND.value
  return int(value) if float(value).is_integer() else value


def _accountants() -> list[str]:
  names = [name.strip().lower() for name in _ACCOUNTANTS.value]
  if not names:
    raise ValueError('`accountants` is empty: name at least one of '
                     f'{", ".join(accounting.ACCOUNTANTS)}.')
  for name in names:
    if name not in accounting.ACCOUNTANTS:
      raise ValueError(f'`accountants` must be among {accounting.ACCOUNTANTS};'
                       f' got {name!r}.')
    if names.count(name) > 1:  # Its figure would be printed twice.
      raise ValueError(f'`accountants` names {name} twice; name each once.')
  return names


def _floats(flag) -> list[float]:
  # ASCII only, as every numeric flag (`cli`): float() reads '١' as 1.
  try:
    return [checks.ascii_number(value) for value in flag.value]
  except ValueError:
    raise ValueError(f'`{flag.name}` must be a comma-separated list of '
                     f'numbers; got {",".join(flag.value)!r}.') from None


def _scales() -> list[tuple[float, float]]:
  cohort = _floats(_COHORT_SCALES)
  population = _floats(_POPULATION_SCALES)
  if len(cohort) != len(population):
    raise ValueError('`extrapolate_cohort_scales` and '
                     '`extrapolate_population_scales` must have the same '
                     f'length; got {len(cohort)} and {len(population)}.')
  return list(zip(cohort, population))


def _describe_guarantee(guarantee: accounting.PrivacyGuarantee) -> str:
  if guarantee.accountant == accounting.RDP:
    note = ''
    if guarantee.rdp_order == max(accounting.RDP_ORDERS):
      note = ', the largest order tried: RDP is loose here, prefer PLD'
    return (f'RDP epsilon = {guarantee.epsilon:.5g} at delta = '
            f'{guarantee.delta:g}  (optimal RDP order '
            f'{guarantee.rdp_order:g}{note})')
  return (f'PLD epsilon = {guarantee.epsilon:.5g} at delta = '
          f'{guarantee.delta:g}  (value discretization interval '
          f'{guarantee.value_discretization_interval:.2g})')


def _reported(sampling: str) -> str:
  """The accountant a training run reports (and calibrates) with."""
  return accounting.reporting_accountant(
      accounting.training_event(1.0, 1, 1, 1, sampling))


def _first_reported(accountants, sampling) -> list[str]:
  """`accountants`, the one a training run reports first."""
  reported = _reported(sampling)
  return sorted(accountants, key=lambda a: a != reported)


def _run_note(guarantee, sampling) -> str:
  return ('  <- what a training run reports' if
          guarantee.accountant == _reported(sampling) else '')


def _unavailable(accountant: str, error: Exception) -> str:
  return f'{accountant.upper()} epsilon = n/a  ({error})'


def _epsilon_lines(noise_multiplier, clients_per_round, population_size,
                   rounds, delta, sampling, accountants) -> list[str]:
  lines = [f'noise_multiplier = {noise_multiplier:g}']
  for accountant in _first_reported(accountants, sampling):
    try:
      guarantee = accounting.compute_training_epsilon(
          noise_multiplier, clients_per_round, population_size, rounds, delta,
          sampling, accountant, _PLD_VALUE_DISCRETIZATION_INTERVAL.value)
      lines.append('  ' + _describe_guarantee(guarantee) +
                   _run_note(guarantee, sampling))
    except dp_accounting.UnsupportedEventError as error:
      lines.append('  ' + _unavailable(accountant, error))
  return lines


def _shown_up(noise_multiplier: float, exponent: int, target_epsilon: float,
              guarantee_of):
  """(z shown, its guarantee): the calibrated `noise_multiplier` rounded UP
  to a multiple of 10**`exponent`, the digits printed, and raised by such
  units while `guarantee_of(z)` misses the target. The printed z is what a
  user copies to --noise_multiplier: rounded to nearest it could be below
  the calibrated one, whose epsilon then exceeds the target (1.080193 for
  1.0801933 gave RDP epsilon 1.0000006 > 1)."""
  unit = decimal.Decimal(1).scaleb(exponent)
  shown = decimal.Decimal(noise_multiplier).quantize(
      unit, rounding=decimal.ROUND_CEILING)
  guarantee = guarantee_of(float(shown))
  while guarantee.epsilon > target_epsilon:  # Where epsilon is not monotone.
    shown += unit
    guarantee = guarantee_of(float(shown))
  return float(shown), guarantee


def _calibration_lines(target_epsilon, clients_per_round, population_size,
                       rounds, delta, sampling, accountants):
  """Lines with the calibrated z per accountant, and the first z found."""
  lines = [f'Noise multiplier for epsilon <= {target_epsilon:g}:']
  calibrated = None
  for accountant in _first_reported(accountants, sampling):
    try:
      noise_multiplier = accounting.calibrate_noise_multiplier(
          target_epsilon, clients_per_round, population_size, rounds, delta,
          sampling, accountant,
          value_discretization_interval=(
              _PLD_VALUE_DISCRETIZATION_INTERVAL.value))
    except dp_accounting.UnsupportedEventError as error:
      lines.append(f'  {accountant.upper()}: n/a  ({error})')
      continue
    noise_multiplier, guarantee = _shown_up(
        noise_multiplier, -6, target_epsilon,
        lambda z, accountant=accountant: accounting.compute_training_epsilon(
            z, clients_per_round, population_size, rounds, delta, sampling,
            accountant, _PLD_VALUE_DISCRETIZATION_INTERVAL.value))
    lines.append(f'  noise_multiplier = {noise_multiplier:.6f}  gives '
                 f'{_describe_guarantee(guarantee)}' +
                 _run_note(guarantee, sampling))
    if calibrated is None:
      calibrated = noise_multiplier
  return lines, calibrated


def _number(value) -> str:
  if isinstance(value, numbers.Integral) or (float(value).is_integer() and
                                             abs(value) < 1e15):
    return f'{int(value):,}'
  return f'{value:.4g}'


def _extrapolation_table(rows) -> str:
  """n, K, q, z, then epsilon (and RDP's order) per accountant, aligned."""
  if not rows:
    return '(no rows)'
  with_order = {a: a == accounting.RDP for a in rows[0].guarantees}
  table = [['n (clients/round)', 'K (population)', 'q', 'z']]
  for accountant, order in with_order.items():
    table[0] += [f'{accountant.upper()} epsilon'] + ['RDP order'] * order
  for row in rows:
    line = [_number(row.clients_per_round), _number(row.population_size),
            f'{row.sampling_probability:.4g}', f'{row.noise_multiplier:.4g}']
    for accountant, guarantee in row.guarantees.items():
      line += [f'{guarantee.epsilon:.4g}'] + (
          [f'{guarantee.rdp_order:g}'] if with_order[accountant] else [])
    table.append(line)
  widths = [max(map(len, column)) for column in zip(*table)]
  return '\n'.join('  '.join(cell.rjust(width)
                             for cell, width in zip(line, widths))
                   for line in table)


def _correlated_lines(rounds, delta, accountants) -> list[str]:
  """Epsilon (or the calibrated z) of correlated noise, min separation."""
  mechanism, bands = _NOISE_MECHANISM.value, _BANDS.value
  separation = _MIN_SEPARATION.value or bands
  noise_multiplier = _NOISE_MULTIPLIER.value
  lines = []
  reported = accounting.reporting_accountant(
      accounting.correlated_training_event(mechanism, 1.0, bands, rounds,
                                           separation,
                                           blt_buffers=_BLT_BUFFERS.value))
  if _TARGET_EPSILON.value is not None:
    noise_multiplier = accounting.calibrate_correlated_noise_multiplier(
        _TARGET_EPSILON.value, mechanism, bands, rounds, separation, delta,
        accountant=reported, blt_buffers=_BLT_BUFFERS.value)
    # Printed with 6 significant digits ({:g}): rounded up to them.
    noise_multiplier, _ = _shown_up(
        noise_multiplier,
        decimal.Decimal(noise_multiplier).adjusted() - 5,
        _TARGET_EPSILON.value,
        lambda z: accounting.compute_epsilon(
            accounting.correlated_training_event(
                mechanism, z, bands, rounds, separation,
                blt_buffers=_BLT_BUFFERS.value), delta, reported))
    lines.append(f'Noise multiplier for epsilon <= '
                 f'{_TARGET_EPSILON.value:g} ({reported.upper()}, as a '
                 'training run reports it):')
  event = accounting.correlated_training_event(mechanism, noise_multiplier,
                                               bands, rounds, separation,
                                               blt_buffers=_BLT_BUFFERS.value)
  lines.append(f'noise_multiplier = {noise_multiplier:g}, {mechanism} noise, '
               f'bands = {bands}, separation = {separation}: '
               f'{event.count} participations of {event.event}')
  for accountant in sorted(accountants, key=lambda a: a != reported):
    try:
      guarantee = accounting.compute_epsilon(event, delta, accountant)
    except dp_accounting.UnsupportedEventError as error:
      lines.append('  ' + _unavailable(accountant, error))
      continue
    lines.append('  ' + _describe_guarantee(guarantee) + (
        '  <- what a training run reports' if accountant == reported
        else ''))
  return lines


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if (_NOISE_MULTIPLIER.value is None) == (_TARGET_EPSILON.value is None):
    raise app.UsageError(
        'Pass exactly one of --noise_multiplier and --target_epsilon.')
  sampling = _SAMPLING.value
  clients_per_round = _clients_per_round()
  population_size = _POPULATION_SIZE.value
  rounds = _ROUNDS.value
  delta = _DELTA.value
  # Everything is computed before anything is printed, so a bad argument
  # gives only its error (which names it).
  ignored = [f'--{name}' for name in (
      'noise_mechanism', 'bands', 'blt_buffers', 'min_separation')
             if flags.FLAGS[name].present]
  if sampling != accounting.MIN_SEPARATION and ignored:
    # Correlated noise is accounted under minimum separation only: a figure
    # for independent noise would not be the mechanism asked about.
    return cli.fail(f'{", ".join(ignored)} apply to --sampling='
                    f'min_separation only; got --sampling={sampling}.')
  for name in ('extrapolate_cohort_scales', 'extrapolate_population_scales'):
    if flags.FLAGS[name].present and not _EXTRAPOLATE.value:
      return cli.fail(f'--{name} applies with --extrapolate only.')
  if sampling == accounting.MIN_SEPARATION:
    # No amplification to extrapolate, and correlated events are accounted
    # on their own grid: these would change nothing.
    unread = [f'--{name}' for name in (
        'extrapolate', 'pld_value_discretization_interval')
              if flags.FLAGS[name].present]
    if unread:
      return cli.fail(f'{", ".join(unread)} apply to --sampling=poisson or '
                      'fixed_size only; got --sampling=min_separation.')
    # The separation, and the flag that gave it (--bands by default).
    separation, given = _MIN_SEPARATION.value, '--min_separation'
    if separation is None:
      separation, given = _BANDS.value, '--bands'
    if separation < 1:
      return cli.fail(f'{given} must be a positive number of rounds; '
                      f'got {separation}.')
    smallest, largest = sampling_lib.group_sizes(population_size, separation)
    if not smallest:  # Empty groups: the separation is at fault.
      return cli.fail(
          f'{given} ({separation}) exceeds --population_size '
          f'({population_size}): some of its minimum-separation groups '
          'would be empty.')
    if not float(clients_per_round).is_integer():  # As training's flag.
      return cli.fail('--clients_per_round must be a whole number of clients '
                      'under --sampling=min_separation (a round takes that '
                      f'many of its group); got {clients_per_round:g}.')
    if not 0 < clients_per_round <= smallest:  # A schedule no sampler runs.
      return cli.fail(
          f'--clients_per_round ({clients_per_round:g}) exceeds the smallest '
          f'minimum-separation group: the {population_size} clients fall '
          f'into {separation} groups of {smallest} to '
          f'{largest}; give at most {smallest}.')
    try:
      lines = _correlated_lines(rounds, delta, _accountants())
    except ValueError as error:
      return cli.fail(error)
    print(f'{rounds} rounds, participation with minimum separation, delta = '
          f'{delta:g}; user-level DP, add-or-remove-one client adjacency, no '
          'amplification')
    print('\n'.join(lines))
    return 0
  try:
    accountants = _accountants()
    if flags.FLAGS['pld_value_discretization_interval'].present and (
        accounting.PLD not in accountants or
        sampling == accounting.FIXED_SIZE):
      # No PLD figure reads it: given, it would change nothing printed.
      return cli.fail('--pld_value_discretization_interval applies to the '
                      'PLD accountant (--accountants with pld) under '
                      f'--sampling=poisson only; got --accountants='
                      f'{",".join(accountants)} --sampling={sampling}.')
    scales = _scales() if _EXTRAPOLATE.value else None
    if scales is not None and sampling == accounting.FIXED_SIZE and (
        accounting.RDP not in accountants):  # A table without an epsilon.
      return cli.fail('--extrapolate under --sampling=fixed_size needs RDP '
                      '(PLD cannot account fixed-size sampling); got '
                      f'--accountants={",".join(accountants)}.')
    if _TARGET_EPSILON.value is not None:
      lines, noise_multiplier = _calibration_lines(
          _TARGET_EPSILON.value, clients_per_round, population_size, rounds,
          delta, sampling, accountants)
    else:
      noise_multiplier = _NOISE_MULTIPLIER.value
      lines = _epsilon_lines(noise_multiplier, clients_per_round,
                             population_size, rounds, delta, sampling,
                             accountants)
    if scales is not None:
      if not noise_multiplier:
        raise ValueError('`--extrapolate` needs a positive noise multiplier.')
      rows = accounting.extrapolate_population(
          noise_multiplier, clients_per_round, population_size, rounds, delta,
          scales, sampling,
          [a for a in accountants if not (
              a == accounting.PLD and sampling == accounting.FIXED_SIZE)])
      lines += [
          '',
          f'Population extrapolation (sigma_DP = z / n = '
          f'{noise_multiplier / clients_per_round:.4g} and clip norm fixed, '
          f'{rounds} rounds, delta = {delta:g}):',
          _extrapolation_table(rows),
      ]
  except (TypeError, ValueError) as error:
    return cli.fail(error)

  adjacency = ('add-or-remove-one client' if sampling == accounting.POISSON
               else 'replace-one client')
  print(f'{rounds} rounds, {sampling} sampling of {clients_per_round:g} of '
        f'{population_size:,} clients per round '
        f'(q = {clients_per_round / population_size:.6g}), delta = {delta:g}; '
        f'user-level DP, {adjacency} adjacency')
  print('\n'.join(lines))
  return 0


if __name__ == '__main__':
  cli.run(main)
