r"""Run a grid of `scripts.train` configurations over seeds, then summarise.

  .venv/bin/python -m scripts.sweep --sweep_name=emnist_bounds \
      --grid=bounding=clip,per_layer_clip --grid=noise_multiplier=none,0.5,1 \
      --seeds=3 -- --task=emnist_cnn --data_source=online --rounds=1500

Every flag after `--` goes to each `scripts.train` run unchanged; `--grid`
values override per cell, and `--seed` is 0..seeds-1. Cells run one after the
other, each in its own process, under `root_output_dir/sweep_name/`.

A cell's identity is its full command: its directory is named by its grid
values, seed and a hash of all its train flags, so changing any flag makes new
cells instead of reusing old results. The sweep is resumable: a finished cell
(its summary.json readable, its metrics.csv there) is skipped, every other is
handed to `scripts.train`, which resumes an interrupted run and rebuilds a
damaged summary or a lost metrics.csv from the run's records. At the end it writes `summary.csv` and
`summary.md`: final accuracy mean +/- std over seeds, epsilon, the last
round's clip norm, wall time per round (a DP run withholds it: round times
reveal the cohort size; released on request, it and a DP run's evaluation of
its clients' data are marked "not covered"), and the cells that failed.
`--dry_run` prints the cells and writes nothing.
"""

import collections
import csv
import hashlib
import itertools
import json
import math
import os
import statistics
import sys

from absl import app
from absl import flags

from scripts import cli
from scripts import outputs

_GRID = flags.DEFINE_multi_string(
    'grid', [], 'name=v1,v2,...: a train flag and its values (repeatable).')
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Seeds per cell (0..seeds-1).')
_ROOT = flags.DEFINE_string('root_output_dir', 'runs', 'Output root.')
_NAME = flags.DEFINE_string('sweep_name', 'sweep', 'Sweep directory name.')
_DRY = flags.DEFINE_bool('dry_run', False, 'Print the cells; run and write '
                         'nothing.')

# Train's flags that absl accumulates (every value counts), not overrides
# (tests/test_sweep.py checks them against train's).
REPEATABLE_FLAGS = ('task_option',)
# Flags the sweep owns: a cell may not override them through --grid.
# What the sweep sets for every cell: given, it would change nothing.
_RESERVED = ('seed', 'experiment_name', 'root_output_dir', 'progress',
             'noprogress')


def parse_grid(entries):
  """['a=1,2', 'b=x'] -> OrderedDict(a=['1', '2'], b=['x'])."""
  grid = collections.OrderedDict()
  for entry in entries:
    name, sep, values = entry.partition('=')
    name = name.strip().lstrip('-')
    if not sep or not name or not values:
      raise app.UsageError(f'--grid must be name=v1,v2,...; got {entry!r}.')
    if name in _RESERVED:
      raise app.UsageError(f'--grid cannot set --{name}: the sweep sets it.')
    if name in grid:
      raise app.UsageError(f'--grid names {name!r} twice.')
    grid[name] = [v.strip() for v in values.split(',')]
    if '' in grid[name]:  # An unset shell variable: a cell would vanish.
      raise app.UsageError(f'--grid {name}: an empty value in {values!r}.')
    repeated = next((v for i, v in enumerate(grid[name])
                     if v in grid[name][:i]), None)
    if repeated is not None:  # The same runs twice, seeds counted twice.
      raise app.UsageError(f'--grid {name}: {repeated!r} is given twice.')
  return grid


def cells(grid):
  """Every combination, as (name, OrderedDict(flag=value))."""
  names = list(grid)
  for values in itertools.product(*(grid[n] for n in names)):
    setting = collections.OrderedDict(zip(names, values))
    label = '_'.join(f'{k}={v}' for k, v in setting.items()) or 'base'
    yield label.replace('/', '-'), setting


def _as_absl_reads(args) -> list:
  """`args` with every --flagfile replaced, where it stands, by the flags
  its file holds (and the files that one names), as absl reads them: a
  later flag overrides a file's, and a file overrides an earlier flag. A
  file that cannot be read stays as given (train refuses the cell, by
  name)."""
  try:
    return flags.FlagValues().read_flags_from_files(list(args),
                                                    force_gnu=False)
  except flags.Error:
    return list(args)


def cell_name(label, seed, train_args, setting):
  """`label_seedN_HASH`: HASH covers every train flag of the cell as
  absl reads them, flag files' flags where the files stand (a flag given
  twice: its last value; a repeatable one: every value), then the grid's,
  so that an edited flag file, or one moved before or after a flag it
  sets, makes a new cell."""
  last = {}  # By flag name; every value of a repeatable flag counts.
  for i, arg in enumerate(_as_absl_reads(train_args)):
    name = arg.lstrip('-').split('=')[0]
    last[(name, i) if name in REPEATABLE_FLAGS else name] = arg
  flags_text = '\n'.join(sorted(last.values()) + _as_absl_reads(
      f'--{k}={v}' for k, v in setting.items()))
  digest = hashlib.sha256(flags_text.encode()).hexdigest()[:8]
  return f'{label}_seed{seed}_{digest}'


def _read_csv(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _mean(values):
  values = [v for v in values if v is not None and math.isfinite(v)]
  return statistics.fmean(values) if values else math.nan


def finished(run_dir) -> bool:
  """Whether the run wrote summary.json (last: it marks the run finished)
  and it reads as one, beside its metrics.csv. A damaged summary or a lost
  metrics.csv is not: the cell goes to train, which rebuilds them from the
  run's records (they are reports, not the records)."""
  if not os.path.isfile(os.path.join(run_dir, 'metrics.csv')):
    return False
  try:
    with open(os.path.join(run_dir, 'summary.json'), encoding='utf-8') as f:
      return isinstance(json.load(f), dict)
  except (OSError, ValueError):
    return False


def _cell_result(run_dir):
  summary = json.load(open(os.path.join(run_dir, 'summary.json')))
  rows = _read_csv(os.path.join(run_dir, 'metrics.csv'))
  as_float = lambda r, k: float(r[k]) if r.get(k) not in (None, '') else math.nan
  none_to = lambda v, default: default if v is None else v
  return dict(
      accuracy=none_to(summary.get('final_eval_accuracy'), math.nan),
      evaluation_withheld=bool(summary.get('evaluation_withheld')),
      epsilon=none_to(summary.get('epsilon'), math.inf),
      # The run's one accountant and delta, named with its epsilon.
      epsilon_by=(f"{str(summary.get('accountant', 'rdp')).upper()}, delta "
                  f"{summary.get('delta', math.nan):g}" +
                  ('' if summary.get('private', True) else ', NOT private')),
      clip_norm=as_float(rows[-1], 'clip_norm') if rows else math.nan,
      seconds_per_round=_mean([as_float(r, 'seconds') for r in rows]),
      # A DP run's columns released on request (--release_uncovered_metrics).
      not_covered=set(summary.get('not_covered_by_epsilon') or ()))


# Under the table: what the columns hold, and a cell without a figure.
LEGEND = ("clip norm: the last round's (adaptive: where the estimate ended), "
          'mean over seeds; -: nothing is bounded. withheld: a DP run does '
          'not release its round times, which reveal the cohort size, '
          "nor its evaluation on the clients' own data (their held-out "
          'examples) (--release_uncovered_metrics releases them). not '
          'covered: released with --release_uncovered_metrics; epsilon does '
          "not cover it (summary.json's not_covered_by_epsilon). n/a: no "
          'seed finished.')
# The table's figures a DP run may release beyond epsilon: their columns.
_UNCOVERED = (('accuracy_mean', 'eval_accuracy'),
              ('seconds_per_round', 'seconds'))


def summarise(sweep_dir, grid, seeds, train_args=(), failed=()):
  """Writes summary.csv and summary.md; returns the rows."""
  rows, withheld = [], []  # Withheld: a run withheld its evaluation.
  uncovered = []  # The table's figures epsilon does not cover, by row.
  for label, setting in cells(grid):
    results = []
    failures = 0
    for seed in range(seeds):
      name = cell_name(label, seed, train_args, setting)
      run_dir = os.path.join(sweep_dir, name)
      failures += name in failed
      if finished(run_dir):
        results.append(_cell_result(run_dir))
    # NaN: not evaluated, or withheld (statistics.stdev fails on NaN).
    accuracies = [r['accuracy'] for r in results
                  if math.isfinite(r['accuracy'])]
    row = collections.OrderedDict(setting)
    row['seeds_done'] = len(results)
    row['seeds_failed'] = failures
    row['accuracy_mean'] = _mean(accuracies)
    row['accuracy_std'] = (statistics.stdev(accuracies)
                           if len(accuracies) > 1 else
                           0.0 if accuracies else math.nan)
    row['epsilon'] = _mean([r['epsilon'] for r in results]) if results else (
        math.nan)
    row['epsilon_by'] = ('; '.join(sorted({r['epsilon_by'] for r in results
                                           if math.isfinite(r['epsilon'])}))
                         if results else '')
    # Not 'clip_norm': a grid over --clip_norm has that column.
    row['final_clip_norm'] = _mean([r['clip_norm'] for r in results])
    row['seconds_per_round'] = _mean([r['seconds_per_round'] for r in results])
    columns = set().union(*(r['not_covered'] for r in results))
    uncovered.append({key for key, column in _UNCOVERED if column in columns})
    row['not_covered_by_epsilon'] = '; '.join(
        sorted(column for _, column in _UNCOVERED if column in columns))
    rows.append(row)
    withheld.append(any(r['evaluation_withheld'] for r in results))
  if not rows:
    return rows
  outputs.write_csv(os.path.join(sweep_dir, 'summary.csv'), rows)
  fmt = lambda v, missing: (missing if math.isnan(v) else f'{v:.4g}')
  lines = ['| ' + ' | '.join(list(grid) + [
      'seeds', 'failed', 'final accuracy', 'epsilon', 'clip norm',
      's / round']) + ' |',
           '|' + '---|' * (len(grid) + 6)]
  for row, evaluation_withheld, marked in zip(rows, withheld, uncovered):
    mark = lambda key, text: (f'{text} (not covered)' if key in marked
                              else text)
    done = row['seeds_done'] > 0
    accuracy = (mark('accuracy_mean', f'{row["accuracy_mean"]:.4f} ± '
                     f'{row["accuracy_std"]:.4f}')
                if not math.isnan(row['accuracy_mean']) else
                'withheld' if evaluation_withheld else 'n/a')
    private = done and math.isfinite(row['epsilon'])
    lines.append('| ' + ' | '.join(
        [str(row[k]) for k in grid] +
        [str(row['seeds_done']),
         str(row['seeds_failed']) if row['seeds_failed'] else '',
         accuracy, (fmt(row['epsilon'], 'n/a') + (
             f" ({row['epsilon_by']})" if row['epsilon_by'] else ''))
         if not done or private else 'no DP',
         fmt(row['final_clip_norm'], '-' if done else 'n/a'),
         mark('seconds_per_round', fmt(row['seconds_per_round'],
                                       'withheld' if private else 'n/a'))]
    ) + ' |')
  lines += ['', LEGEND]
  with open(os.path.join(sweep_dir, 'summary.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
  return rows


# Checks every cell as `scripts.train` would, in a process of its own (train's
# flags and the sweep's share absl's registry); prints the first refusal.
def _first_refused(plan):
  """'cell NAME: why' for the first cell that train refuses, else ''."""
  refused = cli.first_refusal([a for _, a in plan])
  if refused is None:
    return ''
  return f'cell {plan[refused[0]][0]}: {refused[1]}'


def main(argv):
  train_args = argv[1:]
  for arg in train_args:
    name = arg.lstrip('-').split('=')[0]
    if name in _RESERVED:
      raise app.UsageError(f'--{name} is set by the sweep; remove it.')
  grid = parse_grid(_GRID.value)
  if _SEEDS.value <= 0:
    raise app.UsageError('--seeds must be positive.')
  sweep_name = _NAME.value
  if not sweep_name or os.sep in sweep_name or sweep_name in ('.', '..') or (
      not sweep_name.isprintable()):
    raise app.UsageError('--sweep_name must be a non-empty name without '
                         f'{os.sep!r}; got {sweep_name!r}.')
  sweep_dir = os.path.join(_ROOT.value, sweep_name)
  plan = []
  for label, setting in cells(grid):
    for seed in range(_SEEDS.value):
      name = cell_name(label, seed, train_args, setting)
      plan.append((name, [*train_args,
                          *[f'--{k}={v}' for k, v in setting.items()],
                          f'--seed={seed}', f'--experiment_name={name}',
                          f'--root_output_dir={sweep_dir}',
                          '--progress=false']))
  if os.path.isdir(sweep_dir):
    # Another grid's runs: its summary would be overwritten without a word.
    theirs = sorted({d for d in os.listdir(sweep_dir) if os.path.isdir(
        os.path.join(sweep_dir, d))} - {n for n, _ in plan})
    if theirs:
      raise app.UsageError(
          f'--sweep_name={sweep_name}: {sweep_dir} holds runs of another sweep '
          f'({theirs[0]}{", ..." if len(theirs) > 1 else ""}), whose '
          'summary this one would overwrite; name a new sweep.')
  done = lambda name: finished(os.path.join(sweep_dir, name))
  # Finished cells are skipped below, never run again: only the rest is
  # checked.
  error = _first_refused([(n, a) for n, a in plan if not done(n)])
  if error:
    raise app.UsageError(error)
  if not _DRY.value:
    os.makedirs(sweep_dir, exist_ok=True)
  failed = set()
  for i, (name, args) in enumerate(plan, 1):
    if done(name):
      print(f'[{i}/{len(plan)}] {name}: done, skipped', flush=True)
      continue
    print(f'[{i}/{len(plan)}] {name}: scripts.train {" ".join(args)}',
          flush=True)
    if _DRY.value:
      continue
    # Ctrl-C: the cell says how to resume.
    code = cli.run_child([sys.executable, '-m', 'scripts.train', *args])
    if code != 0:
      failed.add(name)
      print(f'[{i}/{len(plan)}] {name}: failed (exit {code}); '
            'rerun the sweep to retry it.', flush=True)
  if _DRY.value:
    print(f'dry run: {len(plan)} runs listed; nothing was run or written.')
    return
  rows = summarise(sweep_dir, grid, _SEEDS.value, train_args, failed)
  if rows:
    print(open(os.path.join(sweep_dir, 'summary.md')).read())
  print(f'summary: {sweep_dir}/summary.csv, {sweep_dir}/summary.md')


if __name__ == '__main__':
  cli.run(main, interrupted='rerun the same command to resume the sweep '
          '(finished cells are skipped, an interrupted one resumes)')
