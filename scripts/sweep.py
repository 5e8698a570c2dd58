r"""Run a grid of `scripts.train` configurations over seeds, then summarise.

  .venv/bin/python -m scripts.sweep --sweep_name=emnist_bounds \
      --grid=bounding=clip,per_layer_clip --grid=noise_multiplier=none,0.5,1 \
      --seeds=3 -- --task=emnist_cnn --data_source=online --rounds=1500

Every flag after `--` goes to each `scripts.train` run unchanged; `--grid`
values override per cell, and `--seed` is 0..seeds-1. Cells run one after the
other, each in its own process, under `root_output_dir/sweep_name/`.

A cell's identity is its full command: its directory is named by its grid
values, seed and a hash of all its train flags, so changing any flag makes new
cells instead of reusing old results. The sweep is resumable: every cell is
handed to `scripts.train`, which reports a finished run without touching it
and resumes an interrupted one. At the end it writes `summary.csv` and
`summary.md`: final accuracy mean +/- std over seeds, epsilon, clipped
fraction, wall time per round (where the runs released it), and the cells
that failed.
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
_DRY = flags.DEFINE_bool('dry_run', False, 'Print the cells, run nothing.')

# Flags the sweep owns: a cell may not override them through --grid.
_RESERVED = ('seed', 'experiment_name', 'root_output_dir')


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
    grid[name] = [v.strip() for v in values.split(',') if v.strip()]
  return grid


def cells(grid):
  """Every combination, as (name, OrderedDict(flag=value))."""
  names = list(grid)
  for values in itertools.product(*(grid[n] for n in names)):
    setting = collections.OrderedDict(zip(names, values))
    label = '_'.join(f'{k}={v}' for k, v in setting.items()) or 'base'
    yield label.replace('/', '-'), setting


def cell_name(label, seed, train_args, setting):
  """`label_seedN_HASH`: HASH covers every train flag of the cell."""
  flags_text = '\n'.join(sorted(train_args) + [
      f'--{k}={v}' for k, v in setting.items()])
  digest = hashlib.sha256(flags_text.encode()).hexdigest()[:8]
  return f'{label}_seed{seed}_{digest}'


def _read_csv(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _mean(values):
  values = [v for v in values if v is not None and math.isfinite(v)]
  return statistics.fmean(values) if values else math.nan


def _cell_result(run_dir):
  summary = json.load(open(os.path.join(run_dir, 'summary.json')))
  rows = _read_csv(os.path.join(run_dir, 'metrics.csv'))
  as_float = lambda r, k: float(r[k]) if r.get(k) not in (None, '') else math.nan
  none_to = lambda v, default: default if v is None else v
  return dict(
      accuracy=none_to(summary.get('final_eval_accuracy'), math.nan),
      epsilon=none_to(summary.get('epsilon'), math.inf),
      clipped_fraction=_mean([as_float(r, 'clipped_fraction') for r in rows]),
      seconds_per_round=_mean([as_float(r, 'seconds') for r in rows]))


def summarise(sweep_dir, grid, seeds, train_args=(), failed=()):
  """Writes summary.csv and summary.md; returns the rows."""
  rows = []
  for label, setting in cells(grid):
    results = []
    failures = 0
    for seed in range(seeds):
      name = cell_name(label, seed, train_args, setting)
      run_dir = os.path.join(sweep_dir, name)
      failures += name in failed
      if os.path.exists(os.path.join(run_dir, 'summary.json')):
        results.append(_cell_result(run_dir))
    accuracies = [r['accuracy'] for r in results]
    row = collections.OrderedDict(setting)
    row['seeds_done'] = len(results)
    row['seeds_failed'] = failures
    row['accuracy_mean'] = _mean(accuracies)
    row['accuracy_std'] = (statistics.stdev(accuracies)
                           if len(accuracies) > 1 else 0.0)
    row['epsilon'] = _mean([r['epsilon'] for r in results]) if results else (
        math.nan)
    row['clipped_fraction'] = _mean([r['clipped_fraction'] for r in results])
    row['seconds_per_round'] = _mean([r['seconds_per_round'] for r in results])
    rows.append(row)
  if not rows:
    return rows
  outputs.write_csv(os.path.join(sweep_dir, 'summary.csv'), rows)
  fmt = lambda v: ('n/a' if isinstance(v, float) and math.isnan(v) else
                   f'{v:.4g}' if isinstance(v, float) else str(v))
  lines = ['| ' + ' | '.join(list(grid) + [
      'seeds', 'failed', 'final accuracy', 'epsilon', 'clipped fraction',
      's / round']) + ' |',
           '|' + '---|' * (len(grid) + 6)]
  for row in rows:
    accuracy = ('n/a' if row['seeds_done'] == 0 else
                f'{row["accuracy_mean"]:.4f} ± {row["accuracy_std"]:.4f}')
    lines.append('| ' + ' | '.join(
        [str(row[k]) for k in grid] +
        [str(row['seeds_done']),
         str(row['seeds_failed']) if row['seeds_failed'] else '',
         accuracy, fmt(row['epsilon']),
         fmt(row['clipped_fraction']), fmt(row['seconds_per_round'])]) + ' |')
  with open(os.path.join(sweep_dir, 'summary.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
  return rows


def main(argv):
  train_args = argv[1:]
  for arg in train_args:
    name = arg.lstrip('-').split('=')[0]
    if name in _RESERVED:
      raise app.UsageError(f'--{name} is set by the sweep; remove it.')
  grid = parse_grid(_GRID.value)
  if _SEEDS.value <= 0:
    raise app.UsageError('--seeds must be positive.')
  sweep_dir = os.path.join(_ROOT.value, _NAME.value)
  os.makedirs(sweep_dir, exist_ok=True)
  plan = [(label, setting, seed) for label, setting in cells(grid)
          for seed in range(_SEEDS.value)]
  failed = set()
  for i, (label, setting, seed) in enumerate(plan, 1):
    name = cell_name(label, seed, train_args, setting)
    run_dir = os.path.join(sweep_dir, name)
    if os.path.exists(os.path.join(run_dir, 'summary.json')):
      print(f'[{i}/{len(plan)}] {name}: done, skipped', flush=True)
      continue
    command = [sys.executable, '-m', 'scripts.train', *train_args,
               *[f'--{k}={v}' for k, v in setting.items()],
               f'--seed={seed}', f'--experiment_name={name}',
               f'--root_output_dir={sweep_dir}', '--progress=false']
    print(f'[{i}/{len(plan)}] {name}: {" ".join(command[2:])}', flush=True)
    if _DRY.value:
      continue
    code = cli.run_child(command)  # Ctrl-C: the cell says how to resume.
    if code != 0:
      failed.add(name)
      print(f'[{i}/{len(plan)}] {name}: failed (exit {code}); '
            'rerun the sweep to retry it.', flush=True)
  rows = summarise(sweep_dir, grid, _SEEDS.value, train_args, failed)
  if rows:
    print(open(os.path.join(sweep_dir, 'summary.md')).read())
  print(f'summary: {sweep_dir}/summary.csv, {sweep_dir}/summary.md')


if __name__ == '__main__':
  cli.run(main, interrupted='rerun the same command to resume the sweep '
          '(finished cells are skipped, an interrupted one resumes)')
