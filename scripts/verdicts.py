"""Paired verdicts: one method against another, seed by seed.

Two benchmark runs with the same seed share their data partition, data
order, model initialization and cohorts (the seed decides them all); what
differs is the method and the DP noise, drawn from a fresh key in every run.
The difference of the two runs' accuracies, seed by seed, is then one draw
of the method's effect with the shared randomness taken out, and the
Student-t interval over those paired differences (n - 1 degrees of freedom,
the sample standard deviation of the differences) says how well the seeds
measured it. A verdict is read from the interval alone:

* `win`: the 95% interval lies above 0 (its lower end > 0);
* `loss`: it lies below 0 (its upper end < 0);
* `tie`: it holds 0. Its half-width says how far the seeds were from
  deciding: +0.5 ± 3.0 is undecided, +0.1 ± 0.2 a tie at this precision.

An interval needs two pairs; with fewer the verdict is `n/a`. A seed run on
one side only has no partner: it is left out, and the comparison lists it
(`PairedDifference.unpaired`) so the report can say so.

Each run's noise key is read from its own record (`fresh_noise_key`): a run
given `--noise_seed` drew predictable noise, and a pair counts as fresh only
when both of its runs drew their own key.
"""

import dataclasses
import json
import math
import os
import statistics
from typing import Mapping, Optional, Sequence

CONFIDENCE = 0.95
WIN, TIE, LOSS, UNDECIDED = 'win', 'tie', 'loss', 'n/a'

# What a report prints above its table of verdicts.
HOW_TO_READ = (
    'Paired differences of test accuracy in points (100 x accuracy), this '
    'method minus the other, over the seeds both ran (the same seed: the '
    'same data, initialization and cohorts; each run its own noise key). '
    f'Interval: {CONFIDENCE:.0%} Student t over the paired differences '
    '(n - 1 degrees of freedom). Verdict from the interval alone: win if it '
    'lies above 0, loss if below, tie if it holds 0 (with its half-width: '
    'how far the seeds were from deciding); n/a under 2 seeds. Fresh keys: '
    'the pairs whose two runs drew their own noise key (no --noise_seed in '
    'their config.json).')


@dataclasses.dataclass(frozen=True)
class Run:
  """One finished run of a comparison: its accuracy and its noise key."""
  accuracy: float
  fresh_noise_key: bool


@dataclasses.dataclass(frozen=True)
class PairedDifference:
  """Ours minus theirs over the seeds both ran, in accuracy points.

  `low` and `high` are None under two pairs. `fresh`: the pairs whose two
  runs drew a fresh noise key. `unpaired`: seeds one side ran and the other
  did not, left out.
  """
  difference: Optional[float]
  low: Optional[float]
  high: Optional[float]
  seeds: int
  fresh: int
  unpaired: tuple = ()

  @property
  def half_width(self) -> Optional[float]:
    return None if self.low is None else (self.high - self.low) / 2

  @property
  def verdict(self) -> str:
    return verdict(self.low, self.high)


def t_interval(differences: Sequence[float], confidence: float = CONFIDENCE):
  """(mean, low, high): the Student-t interval of the mean of `differences`.

  mean -+ t_{(1 + confidence) / 2, n - 1} s / sqrt(n), s the sample standard
  deviation; low and high are None under two values.
  """
  values = [float(v) for v in differences]
  if not values:
    return None, None, None
  mean = statistics.fmean(values)
  if len(values) < 2:
    return mean, None, None
  from scipy import stats  # pylint: disable=g-import-not-at-top
  quantile = stats.t.ppf((1 + confidence) / 2, len(values) - 1)
  half = quantile * statistics.stdev(values) / math.sqrt(len(values))
  return mean, mean - half, mean + half


def verdict(low: Optional[float], high: Optional[float]) -> str:
  """win, loss or tie from an interval alone; n/a without one."""
  if low is None or high is None:
    return UNDECIDED
  if low > 0:
    return WIN
  if high < 0:
    return LOSS
  return TIE


def compare(ours: Mapping[int, Run], theirs: Mapping[int, Run],
            confidence: float = CONFIDENCE) -> PairedDifference:
  """Ours minus theirs, paired by seed (`{seed: Run}` on each side)."""
  seeds = sorted(set(ours) & set(theirs))
  unpaired = tuple(sorted(set(ours) ^ set(theirs)))
  points = [100 * (ours[s].accuracy - theirs[s].accuracy) for s in seeds]
  mean, low, high = t_interval(points, confidence)
  fresh = sum(ours[s].fresh_noise_key and theirs[s].fresh_noise_key
              for s in seeds)
  return PairedDifference(mean, low, high, len(seeds), fresh, unpaired)


def fresh_noise_key(run_dir: str) -> bool:
  """Whether the run in `run_dir` drew its own noise key (its config.json).

  A run given `--noise_seed` drew its noise from that seed: predictable, and
  shared with every run given the same one. A run recorded before the field
  existed drew a fresh key (the field's default).
  """
  path = os.path.join(run_dir, 'config.json')
  try:
    with open(path) as f:
      recorded = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(
        f'{path}: not a readable run configuration ({e}).') from None
  return recorded.get('noise_seed') is None


def _signed(value: float) -> str:
  text = f'{value:+.1f}'
  return '0.0' if text in ('+0.0', '-0.0') else text


def cells(d: PairedDifference) -> list:
  """difference, interval, seeds, fresh keys, verdict: a table's cells."""
  if d.difference is None:
    return ['-', '-', '0', '-', UNDECIDED]
  interval = ('-' if d.low is None else
              f'[{_signed(d.low)}, {_signed(d.high)}]')
  called = d.verdict
  if called == TIE:
    called = f'tie (± {d.half_width:.1f})'
  return [_signed(d.difference), interval, str(d.seeds),
          f'{d.fresh} of {d.seeds}', called]


def csv_fields(d: Optional[PairedDifference], prefix: str = '') -> dict:
  """The comparison as CSV columns (`prefix` + difference, low, ...); empty
  cells for None (no comparison)."""
  values = (('', '', '', '', '', '', '') if d is None else
            (d.difference, d.low, d.high, d.half_width, d.seeds, d.fresh,
             d.verdict))
  names = ('difference', 'low', 'high', 'half_width', 'seeds', 'fresh_keys',
           'verdict')
  return {prefix + name: value for name, value in zip(names, values)}


def format_table(rows) -> str:
  """A markdown table of (method, against, epsilon, PairedDifference) rows."""
  lines = ['| method | against | ε | difference (points) | '
           f'{CONFIDENCE:.0%} interval | seeds | fresh keys | verdict |',
           '|---|---|---:|---:|---|---:|---:|---|']
  for method, against, epsilon, d in rows:
    lines.append(f'| {method} | {against} | {epsilon:g} | ' +
                 ' | '.join(cells(d)) + ' |')
  return '\n'.join(lines)


def unpaired_lines(rows) -> list:
  """One line per comparison that left seeds out (run on one side only)."""
  return [f'{method} against {against} at ε = {epsilon:g}: seeds '
          f'{list(d.unpaired)} ran on one side only and are left out.'
          for method, against, epsilon, d in rows if d.unpaired]


def format_report(rows) -> str:
  """How to read the verdicts, their table, and the seeds left out."""
  parts = [HOW_TO_READ, format_table(rows)]
  left_out = unpaired_lines(rows)
  if left_out:
    parts.append('\n'.join(left_out))
  return '\n\n'.join(parts)
