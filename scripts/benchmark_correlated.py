r"""Accuracy against epsilon: correlated noise against independent noise.

  .venv/bin/python -m scripts.benchmark_correlated              # digits
  .venv/bin/python -m scripts.benchmark_correlated --setting=mnist1000
  .venv/bin/python -m scripts.benchmark_correlated --setting=mnist28
  .venv/bin/python -m scripts.benchmark_correlated --quick      # CI-sized

At each target epsilon every variant calibrates its own noise multiplier
with its own accountant (`--target_epsilon`), with the same rounds, cohort
size and seeds (`SETTINGS`: the settings of `scripts.benchmark_utility`,
and `mnist1000`, the population of `scripts.benchmark_frontier` at the
server learning rate and target quantile its tuning chose for both tff_clip's
default and TFF's adaptive clipping):

* `independent`: today's default, fresh noise each round with Poisson
  sampling (amplified by sampling).
* `banded_b` and `tree_b`: tff_clip's correlated noise with the default
  bounding (adaptive normalization) and participation with minimum
  separation b (b groups, round t trains group t mod b; not amplified).
* `blt_b`: BLT noise (its default `--blt_buffers`, optimized for the
  run's rounds and separation b) under the same participation.
* `tff_tree_b`: TFF's `DifferentiallyPrivateFactory.tree_adaptive`,
  restarted every b rounds, under the same participation: the baseline.
* `banded_{b/4}` (b >= 8 only): banded noise with b/4 bands under the same
  separation b.
A variant named with another b (`--variants=blt_20` on a setting whose b is
5) runs with that b: a command that names its variants means the same
with or without `--bands`.

The minimum-separation variants train one of b seeded groups a round, and a
group may hold fewer clients than the setting's cohort (the sampler refuses
such a cohort: the mean would be divided by more clients than take part).
Their cohort is the largest the run's groups can honour, the smallest
group's size (`benchmark_settings.separated_cohort`; it depends on the
seed), the noise calibrated for it; `independent` keeps the setting's. The
`cohort` column of the table and of `correlated.csv` records the cohorts
each variant ran with.

Runs are ordinary run directories under `--root_output_dir` (a rerun skips
finished ones). Prints a table of the final eval accuracy (mean +- std over
seeds) per variant and epsilon, and saves `correlated.csv`, `correlated.md`
and `correlated.png` (accuracy against epsilon).
"""

import collections
import dataclasses
import os
import statistics

from absl import flags

from scripts import benchmark_settings
from scripts import cli
from scripts import outputs
from scripts import program
from scripts import trainings
from scripts import verdicts
from tff_clip.program import config as config_lib

# name -> (TrainConfig fields, default b). Digits and MNIST-28 fix the
# partition at Dirichlet(0.5) and run scripts.train's default bounding. On
# mnist1000 (1,000 clients, 50 per round) b = 20 makes a group the size of a
# cohort on average (31 to 67 clients over seeds 0-4: a separated run's
# cohort is its smallest group's, `configs`): every client takes part at
# most 5 times in 100 rounds, as many as Poisson sampling's expectation;
# the server learning rate 0.5 and target quantile
# 0.1 are the cells docs/frontier_tuned.md's tuning chose at epsilon 4 for both
# normalize_adaptive and tff_adaptive.
# digits and mnist28 track the 0.3 quantile, tff_clip's default when
# docs/correlated_noise.md's tables were measured (the default now follows
# the noise: `tff_clip.aggregation.noise_following`).
SETTINGS = {
    'digits': (dict(benchmark_settings.SETTINGS['digits'],
                    partition_alpha=0.5, target_quantile=0.3), 5),
    'mnist28': (dict(benchmark_settings.SETTINGS['mnist28'],
                     partition_alpha=0.5, target_quantile=0.3), 5),
    'mnist1000': (dict(benchmark_settings.FRONTIER['mnist1000'],
                       server_learning_rate=0.5, target_quantile=0.1), 20),
}

_SETTING = flags.DEFINE_enum('setting', 'digits', list(SETTINGS),
                             'The population, model and training (SETTINGS).')
_EPSILONS = flags.DEFINE_list('epsilons', ['2', '4', '8'], 'Target epsilons.')
_SEEDS = flags.DEFINE_integer('seeds', 5, 'Seeds per variant and epsilon.')
_BANDS = flags.DEFINE_integer('bands', None, 'b: bands, tree restart period '
                              'and participation separation (default: the '
                              "setting's).")
_VARIANTS = flags.DEFINE_list('variants', [], 'Variants (default all).')
_QUICK = flags.DEFINE_bool('quick', False, 'CI size: 2 rounds, 1 seed, one '
                           'epsilon.')
_JOBS = flags.DEFINE_integer(
    'jobs', 1, 'Trainings run side by side, each in its own process '
    '(`scripts.trainings.run_all`); 1: one after another, in this '
    'process.')
_ROOT = flags.DEFINE_string('root_output_dir', 'runs/correlated',
                            'Output root.')


def variants(bands: int) -> dict:
  """name -> the TrainConfig fields that make the variant."""
  separated = dict(sampling='min_separation', bands=bands)
  table = collections.OrderedDict([
      ('independent', dict(sampling='poisson')),
      (f'banded_{bands}', dict(separated, noise_mechanism='banded')),
      (f'tree_{bands}', dict(separated, noise_mechanism='tree')),
      (f'blt_{bands}', dict(separated, noise_mechanism='blt')),
      (f'tff_tree_{bands}', dict(separated, noise_mechanism='tree',
                                 bounding='tff_tree_adaptive',
                                 clip_norm='adaptive')),
  ])
  if bands >= 8:
    # Fewer bands than the separation: a smaller sensitivity (column norm),
    # less noise cancelled.
    table[f'banded_{bands // 4}'] = dict(separated, noise_mechanism='banded',
                                        bands=bands // 4, min_separation=bands)
  return table


def named_variants(names, table) -> dict:
  """The variants of `names` that `table` lacks, b read from the name.

  `blt_20` is BLT noise with b = 20 whatever `--bands` says, so a command
  that names its variants runs the same b with or without `--bands`.
  """
  out = {}
  for name in names:
    kind, _, b = name.rpartition('_')
    if name not in table and b.isdigit() and int(b) > 0:
      out.update((n, fields) for n, fields in variants(int(b)).items()
                 if n == name and n.rpartition('_')[0] == kind)
  return out


def configs(setting, names, table, epsilons, seeds, rounds, root):
  """(variant, epsilon, seed, TrainConfig) for every run, validated up front."""
  out = []
  for seed in seeds:
    for epsilon in epsilons:
      for name in names:
        fields = dict(SETTINGS[setting][0], noise_multiplier=None,
                      target_epsilon=epsilon,
                      eval_every=10**6, progress=False, plot=False,
                      root_output_dir=root,
                      experiment_name=f'{name}_eps{epsilon:g}_seed{seed}',
                      seed=seed)
        if rounds:
          fields['rounds'] = rounds
        fields.update(table[name])
        config = config_lib.TrainConfig(**fields)
        if config.sampling == 'min_separation':
          # The sampler refuses a group smaller than the cohort: the largest
          # cohort this seed's groups honour (z is calibrated for it).
          try:
            cohort = benchmark_settings.separated_cohort(config)
          except ValueError as e:
            raise config_lib.ConfigError(str(e)) from None
          config = dataclasses.replace(config, clients_per_round=cohort)
        program.validate(config)
        out.append((name, epsilon, seed, config))
  return out


def summarise(results, names, epsilons):
  """One row per variant: mean and std of the accuracy at each epsilon."""
  rows = []
  for name in names:
    row = collections.OrderedDict(variant=name)
    for epsilon in epsilons:
      accuracies = [r['accuracy'] for r in results
                    if r['variant'] == name and r['epsilon'] == epsilon]
      row[f'eps{epsilon:g}_mean'] = (statistics.fmean(accuracies)
                                     if accuracies else None)
      row[f'eps{epsilon:g}_std'] = (statistics.stdev(accuracies)
                                    if len(accuracies) > 1 else 0.0)
      row[f'eps{epsilon:g}_seeds'] = len(accuracies)
      # The epsilon the runs' ledgers report (at most the target).
      spent = [r['spent'] for r in results if r['variant'] == name and
               r['epsilon'] == epsilon and r.get('spent') is not None]
      row[f'eps{epsilon:g}_spent'] = max(spent) if spent else None
    # The clients per round of its runs (a separated variant's: the smallest
    # group of each seed, `benchmark_settings.separated_cohort`).
    row['cohort'] = benchmark_settings.cohort_range(
        r['cohort'] for r in results
        if r['variant'] == name and r.get('cohort') is not None)
    rows.append(row)
  return rows


def paired(results, names, epsilons, bands):
  """(variant, against, epsilon, PairedDifference) rows: every correlated
  variant against independent noise and against TFF's tree of the same b,
  paired by seed (`scripts.verdicts`), where both ran."""
  runs = collections.defaultdict(dict)
  for r in results:
    runs[r['variant'], r['epsilon']][r['seed']] = verdicts.Run(
        r['accuracy'], r['fresh'])
  baselines = [b for b in ('independent', f'tff_tree_{bands}') if b in names]
  out = []
  for against in baselines:
    for name in names:
      if name in baselines:
        continue
      for epsilon in epsilons:
        out.append((name, against, epsilon, verdicts.compare(
            runs[name, epsilon], runs[against, epsilon])))
  if len(baselines) == 2:
    out.extend((baselines[1], baselines[0], epsilon, verdicts.compare(
        runs[baselines[1], epsilon], runs[baselines[0], epsilon]))
               for epsilon in epsilons)
  return out


def format_table(rows, epsilons):
  head = ('| variant | ' + ' | '.join(f'ε = {e:g}' for e in epsilons) +
          ' | cohort |')
  lines = [head, '|---|' + '---:|' * (len(epsilons) + 1)]
  for row in rows:
    cells = []
    for e in epsilons:
      mean = row[f'eps{e:g}_mean']
      cells.append('n/a' if mean is None else
                   f'{mean:.4f} ± {row[f"eps{e:g}_std"]:.4f} '
                   f'({row[f"eps{e:g}_seeds"]})')
    lines.append(f'| {row["variant"]} | ' + ' | '.join(cells) +
                 f' | {row.get("cohort") or "-"} |')
  return '\n'.join(lines)


def plot(rows, epsilons, path, title, delta=1e-5):
  with outputs.figure(path, figsize=(7, 4.5)) as (fig, ax):
    for row in rows:
      points = [(e, row[f'eps{e:g}_mean'], row[f'eps{e:g}_std'])
                for e in epsilons if row[f'eps{e:g}_mean'] is not None]
      if points:
        xs, ys, errs = zip(*points)
        ax.errorbar(xs, ys, yerr=errs, marker='o', capsize=3,
                    label=row['variant'])
    ax.set_xlabel(f'epsilon (δ = {delta:g}, each mechanism its own accountant)')
    ax.set_ylabel('final eval accuracy (mean ± std)')
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()


def main(argv):
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {argv[1:]}')
  try:
    epsilons = [float(e) for e in _EPSILONS.value]
  except ValueError:
    return cli.fail(f'--epsilons must be numbers; got {_EPSILONS.value}.')
  if not epsilons or min(epsilons) <= 0:
    return cli.fail('--epsilons must be positive numbers.')
  if _SEEDS.value <= 0:
    return cli.fail('--seeds must be positive.')
  bands = SETTINGS[_SETTING.value][1] if _BANDS.value is None else _BANDS.value
  if bands <= 0:
    return cli.fail('--bands must be positive.')
  table = variants(bands)
  names = list(_VARIANTS.value) or list(table)
  table.update(named_variants(names, table))
  unknown = [v for v in names if v not in table]
  if unknown:
    return cli.fail(f'--variants: unknown {unknown}; choose from '
                    f'{", ".join(table)} (or another b: banded_<b>, '
                    'tree_<b>, blt_<b>, tff_tree_<b>).')
  seeds, rounds = list(range(_SEEDS.value)), None
  if _QUICK.value:
    seeds, rounds, epsilons = seeds[:1], 2 * bands, epsilons[-1:]
  root = os.path.join(_ROOT.value, _SETTING.value)
  try:
    plan = configs(_SETTING.value, names, table, epsilons, seeds, rounds,
                   root)
  except config_lib.ConfigError as e:
    return cli.fail(e)
  if _JOBS.value < 1:
    return cli.fail('--jobs must be at least 1.')
  outcomes = trainings.run_all([p[3] for p in plan], _JOBS.value,
                               'correlated')
  results = []
  for (name, epsilon, seed, config), (accuracy, spent) in zip(plan, outcomes):
    run_dir = os.path.join(config.root_output_dir, config.experiment_name)
    results.append(dict(variant=name, epsilon=epsilon, seed=seed,
                        accuracy=accuracy, spent=spent,
                        cohort=config.clients_per_round,
                        fresh=verdicts.fresh_noise_key(run_dir)))
  rows = summarise(results, names, epsilons)
  text = format_table(rows, epsilons)
  comparisons = paired(results, names, epsilons, bands)
  if comparisons:
    text += '\n\n' + verdicts.format_report(comparisons)
  outputs.write_csv(os.path.join(root, 'correlated.csv'), rows)
  with open(os.path.join(root, 'correlated.md'), 'w') as f:
    f.write(text + '\n')
  first = plan[0][3]
  plot(rows, epsilons, os.path.join(root, 'correlated.png'),
       f'{_SETTING.value}: {first.rounds} rounds x '
       f'{SETTINGS[_SETTING.value][0]["clients_per_round"]} clients '
       f'(separated: the smallest group), b = {bands}, '
       f'{len(seeds)} seeds', first.delta)
  print(text)
  print(f'outputs: {root}/correlated.csv, correlated.md, correlated.png')
  return 0


if __name__ == '__main__':
  cli.run(main, interrupted=cli.RESUMES_ITS_RUNS)
