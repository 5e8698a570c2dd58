r"""The privacy-utility frontier: every method tuned alike, then run on fresh seeds.

  .venv/bin/python -m scripts.benchmark_frontier                  # MNIST, 1,000 clients
  .venv/bin/python -m scripts.benchmark_frontier --setting=digits1000
  .venv/bin/python -m scripts.benchmark_frontier --quick          # CI-sized

The protocol (McMahan et al. 2018; Andrew et al. 2021: compare methods after
tuning each with the same budget):

1. **Tune.** Every method runs every cell of the same grid (`grid`: the
   server learning rate, and the method's own knob: the target quantile of
   an adaptive norm or the value of a fixed one) at each tuning epsilon, on
   `--tuning_seeds` seeds that are never reported, evaluated on a validation
   split held out from the training examples (`--validation_fraction`; no
   client trains on it). The cell with the best mean validation accuracy
   wins, per method and epsilon.
2. **Report.** The winning cell runs on `--final_seeds` fresh seeds (20 by
   default: a 5-seed mean moves by more than the differences between
   methods) at every epsilon and is evaluated on the test set. The noise
   multiplier of every run is calibrated by the accountant to the target
   epsilon (`--target_epsilon`), with Poisson sampling from the whole
   population (the correlated-noise methods: participation with minimum
   separation) and delta at most 1 / population.
3. **Defaults, untuned.** `default` (tff_clip's own defaults: nothing set
   but the setting's training) and `tff_default` (TFF's
   `gaussian_adaptive` at its own defaults, what `dp_aggregator` builds)
   skip the grid and run the final seeds only, both at the server learning
   rate 1.0 that `TrainConfig` and TFF's FedAvg default to.
4. **Verdicts.** Every comparison is paired by seed (the same seed: the same
   data, initialization and cohorts; each run its own noise key) and called
   win, tie or loss from the 95% Student-t interval of the paired
   differences alone (`scripts.verdicts`): each method against tuned TFF
   `dp_aggregator` (`tff_adaptive`); the default against TFF's default,
   against the best tuned tff_clip method and against the best tuned TFF
   method (both picked by validation accuracy, so the test seeds do not
   pick them); each correlated-noise tff_clip method against TFF's
   correlated counterpart under the same participation (`tree_adaptive`
   for an adaptive norm), each BLT method against banded noise with the
   same bounding (the same seed: the same groups and cohorts), and each
   banded or BLT method against independent noise with its bounding. Each
   verdict says how many seeds it paired and how many of them drew fresh
   noise keys (read from the runs' config.json).

The correlated-noise methods train one of b = population / clients_per_round
seeded groups a round, and a group may hold fewer clients than
`clients_per_round` (the sampler refuses such a cohort: the mean would be
divided by more clients than take part). Their cohort is the largest the
run's groups can honour, the smallest group's size
(`benchmark_settings.separated_cohort`; it depends on the seed), the noise
calibrated for it; the `cohort` column of `frontier.csv` and `frontier.md`
records the cohorts each method ran with.

A non-private run of the same model, tuned on the same server learning
rates, gives the ceiling (`--noceiling` leaves it out: a comparison of
untuned methods then trains only its final runs). Every run is an ordinary
run directory under `--root_output_dir/<setting>/` (`tune/` and `final/`):
a rerun skips finished runs and resumes interrupted ones, so the command can
be stopped and started again (and `--final_seeds` raised: only the new seeds
train). `--jobs` runs that many trainings side by side, each in its own
process (default: one per core).

Writes, next to the runs: `tuning.csv` (every cell's validation accuracy),
`chosen.md` (the grid and the chosen cell per method and epsilon),
`frontier.csv` (per method and epsilon: test accuracy, mean and std over
seeds, and the paired difference from tuned TFF `dp_aggregator`: difference,
interval, seeds, fresh keys, verdict), `verdicts.csv` (every comparison,
one per row), `frontier.md` (both tables) and `frontier.png` (accuracy
against epsilon with error bars, one std, and the non-private ceiling where
it ran).
"""

import collections
import dataclasses
import itertools
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

_SETTING = flags.DEFINE_enum(
    'setting', 'mnist1000', list(benchmark_settings.FRONTIER),
    'The population and model (SETTINGS; digits_heldout and mnist_heldout: '
    "settings the default's rule was not chosen on).")
_EPSILONS = flags.DEFINE_list('epsilons', ['2', '4', '8'],
                              'Target epsilons of the final runs.')
_TUNE_EPSILONS = flags.DEFINE_list(
    'tune_epsilons', [], 'Epsilons the grid is tuned at (default: every '
    '--epsilons value); a final epsilon without its own tuning uses the '
    'nearest tuned one.')
_METHODS = flags.DEFINE_list('methods', [], 'Methods (default all).')
_TUNING_SEEDS = flags.DEFINE_integer('tuning_seeds', 2,
                                     'Seeds per grid cell (never reported).')
_FINAL_SEEDS = flags.DEFINE_integer(
    'final_seeds', 20, 'Fresh seeds of each chosen setting (0, 1, ...), '
    'every comparison paired over them; 20 make a 95% interval about half as '
    "wide as 5 do. A rerun with more reuses the finished seeds' runs.")


_JOBS = flags.DEFINE_integer(
    'jobs', None, 'Trainings run side by side, each in its own process, so '
    f'N jobs keep N cores busy. Default: one per core ({trainings.cores()} here); 1 '
    'trains in this process, one run after another.')
_QUICK = flags.DEFINE_bool('quick', False, 'CI size: 2 rounds, 1 seed, one '
                           'epsilon, two methods, two grid cells.')
_ROOT = flags.DEFINE_string('root_output_dir', 'runs/frontier', 'Output root.')
_CEILING = flags.DEFINE_bool(
    'ceiling', True, 'Tune and report the non-private ceiling (3 tuning '
    'cells and --final_seeds runs); --noceiling leaves it out, so comparing '
    'untuned methods trains only their final runs.')

# Seeds of the tuning runs: disjoint from the final runs' 0, 1, 2, ...
TUNING_SEED_BASE = 1000

# The population, model and training shared by every method
# (`scripts.benchmark_settings.FRONTIER`, where the choice is explained).
SETTINGS = benchmark_settings.FRONTIER

# The participation of the correlated-noise methods (`make_config` sets the
# separation and bands).
SEPARATED = dict(sampling='min_separation')

# name -> the TrainConfig fields that make the method.
METHODS = collections.OrderedDict([
    ('tff_fixed', dict(bounding='tff_gaussian')),
    ('tff_adaptive', dict(bounding='tff_gaussian', clip_norm='adaptive')),
    ('clip_fixed', dict(bounding='clip')),
    ('clip_adaptive', dict(bounding='clip', clip_norm='adaptive')),
    ('normalize_fixed', dict(bounding='normalize')),
    ('normalize_adaptive', dict(bounding='normalize', clip_norm='adaptive')),
    ('per_layer_clip_fixed', dict(bounding='per_layer_clip')),
    ('per_layer_clip_adaptive', dict(bounding='per_layer_clip',
                                     clip_norm='adaptive')),
    ('per_layer_normalize_fixed', dict(bounding='per_layer_normalize')),
    ('per_layer_normalize_adaptive', dict(bounding='per_layer_normalize',
                                          clip_norm='adaptive')),
    # Correlated noise (docs/correlated_noise.md) under participation with
    # minimum separation b = population / clients_per_round (`make_config`):
    # every client takes part rounds / b times, as often as Poisson
    # sampling's expectation, with as many bands as the separation; the
    # cohort is the smallest group's size (`separated_cohort`), at most
    # clients_per_round.
    ('banded_normalize_adaptive', dict(SEPARATED, bounding='normalize',
                                       clip_norm='adaptive',
                                       noise_mechanism='banded')),
    ('banded_normalize_fixed', dict(SEPARATED, bounding='normalize',
                                    noise_mechanism='banded')),
    # BLT noise (its default buffers, optimized for the run's rounds and
    # separation) with the same bounding and participation as banded.
    ('blt_normalize_adaptive', dict(SEPARATED, bounding='normalize',
                                    clip_norm='adaptive',
                                    noise_mechanism='blt')),
    ('blt_normalize_fixed', dict(SEPARATED, bounding='normalize',
                                 noise_mechanism='blt')),
    ('tff_tree_adaptive', dict(SEPARATED, bounding='tff_tree_adaptive',
                               clip_norm='adaptive', noise_mechanism='tree')),
])
# Untuned: the libraries' own defaults, run on the final seeds only.
# `default`: tff_clip's defaults (no aggregation field set: whatever
# `TrainConfig` chooses). `tff_default`: TFF's `gaussian_adaptive` at its
# signature's defaults, which `tff.learning.dp_aggregator` builds (less its
# zeroing of outsized updates). Neither the setting nor either library's
# aggregator sets the server learning rate: both run at `TrainConfig`'s 1.0,
# also TFF FedAvg's default.
DEFAULT = 'default'
TFF_DEFAULT = 'tff_default'
# The default with the server step also held to the smallest update norm
# since round 10 (--server_step=held; docs/frontier_history_3.md, "A step held
# at the smallest update norm").
DEFAULT_HELD = 'default_held'
TFF_GAUSSIAN_ADAPTIVE_DEFAULTS = dict(initial_clip_norm=0.1,
                                      target_quantile=0.5,
                                      clip_learning_rate=0.2,
                                      clipped_count_stddev=None)
METHODS[DEFAULT] = {}
METHODS[DEFAULT_HELD] = dict(server_step='held')
METHODS[TFF_DEFAULT] = dict(TFF_GAUSSIAN_ADAPTIVE_DEFAULTS,
                            bounding='tff_gaussian', clip_norm='adaptive')
UNTUNED = (DEFAULT, DEFAULT_HELD, TFF_DEFAULT)
# Every method but tff_clip's default keeps its server learning rate fixed
# (a tuned method's step is the learning rate it was tuned to; TFF's keep
# TFF's); the default's is `TrainConfig`'s (--server_step=auto: damped).
for _name in METHODS:
  if _name not in (DEFAULT, DEFAULT_HELD):
    METHODS[_name]['server_step'] = 'fixed'
BASELINE = 'tff_adaptive'  # What `tff.learning.dp_aggregator` builds.
TUNED_BASELINE = f'{BASELINE} (tuned)'  # Its name in the verdicts.
# TFF's correlated-noise baseline (`DifferentiallyPrivateFactory.
# tree_adaptive`): what the correlated methods are compared with cell by cell.
CORRELATED_BASELINE = 'tff_tree_adaptive'
CEILING = 'no_dp'
# Each BLT method and the banded method with its bounding: the mechanism it
# replaces, compared seed by seed.
BLT_AGAINST_BANDED = {'blt_normalize_adaptive': 'banded_normalize_adaptive',
                      'blt_normalize_fixed': 'banded_normalize_fixed'}
# Each tff_clip correlated method and the independent-noise method with the
# same bounding.
INDEPENDENT_COUNTERPART = {
    name: name.split('_', 1)[1] for name in METHODS
    if name.startswith(('banded_', 'blt_'))}

# The same grid for every method: server learning rates x the method's knob.
SERVER_LEARNING_RATES = (0.25, 0.5, 2.0)
TARGET_QUANTILES = (0.1, 0.3, 0.7)  # Adaptive norms.
FIXED_NORMS = (0.03, 0.1, 1.0)  # Fixed norms.
QUICK_METHODS = ('tff_adaptive', 'normalize_adaptive')
_LEARNING_RATES = flags.DEFINE_list(
    'server_learning_rates', [str(v) for v in SERVER_LEARNING_RATES],
    "The grid's server learning rates (every method's; the non-private "
    "ceiling keeps the frontier's).")
# A grid value of the target quantile that leaves it unset, so the run
# resolves it as tff_clip's default does (`tff_clip.aggregation.
# noise_following`: from the run's z, cohort and model size).
NOISE_FOLLOWING = 'noise'
_QUANTILES = flags.DEFINE_list(
    'target_quantiles', [str(v) for v in TARGET_QUANTILES],
    "The grid's target quantiles (the adaptive methods'); "
    f"'{NOISE_FOLLOWING}': the quantile tff_clip's default resolves from the "
    "noise (TFF's methods keep 0.5).")


def grid(method: str, learning_rates=SERVER_LEARNING_RATES,
         quantiles=TARGET_QUANTILES) -> list:
  """The grid cells of `method`, each a dict of TrainConfig fields."""
  if method in UNTUNED:
    return [{}]
  if method == CEILING:
    knobs = [{}]
  elif METHODS[method].get('clip_norm') == 'adaptive':
    knobs = [dict(target_quantile=q) for q in quantiles]
  else:
    knobs = [dict(clip_norm=c) for c in FIXED_NORMS]
  return [dict(knob, server_learning_rate=lr)
          for lr, knob in itertools.product(learning_rates, knobs)]


def _label(value) -> str:
  """A grid value as cell names and reports write it."""
  return NOISE_FOLLOWING if value is None else format(value, 'g')


def cell_name(cell: dict) -> str:
  return '_'.join(f'{key}{_label(value)}' for key, value in sorted(cell.items()))


def tff_method(method: str) -> bool:
  """Whether `method` is one of TFF's own aggregators."""
  return method.startswith('tff_')


def make_config(setting, method, cell, epsilon, seed, phase, root, quick):
  """The TrainConfig of one run, validated."""
  fields = dict(SETTINGS[setting], eval_every=10**6, progress=False,
                plot=False,
                checkpoint_every=benchmark_settings.GRID_CHECKPOINT_EVERY,
                seed=seed, root_output_dir=os.path.join(root, phase),
                eval_split='validation' if phase == 'tune' else 'test')
  if method == CEILING:
    fields.update(bounding='none', noise_multiplier=None, server_step='fixed')
    name = f'{method}_{cell_name(cell)}_seed{seed}'
  else:
    fields.update(METHODS[method], target_epsilon=epsilon,
                  noise_multiplier=None)
    if correlated(method):
      fields['bands'] = fields['num_clients'] // fields['clients_per_round']
    name = '_'.join(part for part in (method, f'eps{epsilon:g}',
                                      cell_name(cell), f'seed{seed}') if part)
  fields.update(cell)
  if quick:
    fields['rounds'] = 2
  config = config_lib.TrainConfig(experiment_name=name, **fields)
  if correlated(method):
    # A group smaller than clients_per_round is refused by the sampler: the
    # largest cohort this seed's groups honour (z is calibrated for it).
    try:
      cohort = benchmark_settings.separated_cohort(config)
    except ValueError as e:
      raise config_lib.ConfigError(str(e)) from None
    config = dataclasses.replace(config, clients_per_round=cohort)
  program.validate(config)
  return config


def tuning_plan(setting, methods, cells, tune_epsilons, tuning_seeds, root,
                quick):
  """(method, epsilon, cell index, TrainConfig) of every tuning run.

  The untuned methods (`UNTUNED`) have none; the ceiling's (`CEILING`) are
  there where `cells` has its grid.
  """
  plan = [(m, e, i, make_config(setting, m, cell, e, seed, 'tune', root,
                                quick))
          for m in methods if m not in UNTUNED for e in tune_epsilons
          for i, cell in enumerate(cells[m]) for seed in tuning_seeds]
  return plan + [(CEILING, None, i, make_config(setting, CEILING, cell, None,
                                                seed, 'tune', root, quick))
                 for i, cell in enumerate(cells.get(CEILING, ()))
                 for seed in tuning_seeds]


def choose(tune_plan, accuracies, cells):
  """The best cell per (method, epsilon), by mean validation accuracy.

  Returns ({(method, epsilon): (cell index, mean)}, rows of every cell's
  mean). A tie keeps the earlier cell of the grid.
  """
  scores = collections.defaultdict(list)
  for (method, epsilon, i, _), accuracy in zip(tune_plan, accuracies):
    scores[method, epsilon, i].append(accuracy)
  rows, chosen = [], {}
  for (method, epsilon, i), values in scores.items():
    mean = statistics.fmean(values)
    rows.append(collections.OrderedDict(
        method=method, epsilon='' if epsilon is None else epsilon,
        cell=cell_name(cells[method][i]), validation_accuracy=mean,
        seeds=len(values)))
    best = chosen.get((method, epsilon))
    if best is None or mean > best[1]:
      chosen[method, epsilon] = (i, mean)
  return chosen, rows


def correlated(method: str) -> bool:
  """Whether `method` adds correlated noise (minimum-separation sampling)."""
  return METHODS.get(method, {}).get('sampling') == SEPARATED['sampling']


def counterpart(method: str) -> str:
  """The TFF method with the same grid as `method` (same kind of norm).

  Adaptive correlated methods are compared with TFF's tree aggregation under
  the same participation; TFF has no fixed-norm correlated factory, so fixed
  ones are compared with TFF's fixed clipping.
  """
  if METHODS[method].get('clip_norm') == 'adaptive':
    return CORRELATED_BASELINE if correlated(method) else 'tff_adaptive'
  return 'tff_fixed'


def same_cell_leads(tuning_rows) -> list:
  """Each method against its TFF counterpart cell by cell, before choosing.

  For every (method, tuning epsilon) with a TFF counterpart in
  `tuning_rows` (`choose`'s rows), the lead in points at every grid cell both
  ran: how a method fares when both get the same, untuned, setting.
  Returns rows of method, epsilon, counterpart, cells, cells led, and the
  median, smallest and largest lead.
  """
  score = {(r['method'], r['epsilon'], r['cell']): r['validation_accuracy']
           for r in tuning_rows}
  out = []
  for method, epsilon in dict.fromkeys(
      (r['method'], r['epsilon']) for r in tuning_rows):
    if method == CEILING or tff_method(method):
      continue
    other = counterpart(method)
    leads = [100 * (value - score[other, e, cell])
             for (m, e, cell), value in score.items()
             if m == method and e == epsilon and (other, e, cell) in score]
    if leads:
      out.append(collections.OrderedDict(
          method=method, epsilon=epsilon, counterpart=other,
          cells=len(leads), cells_led=sum(lead > 0 for lead in leads),
          median_lead=statistics.median(leads), min_lead=min(leads),
          max_lead=max(leads)))
  return out


def format_same_cell(rows) -> str:
  lines = ['| method | tuned at ε | against | cells led | median lead | '
           'range (points) |', '|---|---:|---|---:|---:|---:|']
  for r in rows:
    lines.append(f'| {r["method"]} | {r["epsilon"]:g} | {r["counterpart"]} | '
                 f'{r["cells_led"]} of {r["cells"]} | '
                 f'{r["median_lead"]:+.1f} | {r["min_lead"]:+.1f} to '
                 f'{r["max_lead"]:+.1f} |')
  return '\n'.join(lines)


def nearest(value, choices):
  return min(choices, key=lambda c: (abs(c - value), c))


def _mean_std(values):
  return (statistics.fmean(values),
          statistics.stdev(values) if len(values) > 1 else 0.0)


def best_tuned(methods, chosen, tune_epsilon, tff: bool):
  """The tuned method of TFF (`tff`) or of tff_clip with the best validation
  accuracy at `tune_epsilon` (`choose`'s means; a tie: the earlier in
  `methods`), or None."""
  candidates = [m for m in methods if m not in UNTUNED and
                tff_method(m) == tff and (m, tune_epsilon) in chosen]
  if not candidates:
    return None
  return max(candidates, key=lambda m: chosen[m, tune_epsilon][1])


def comparisons(runs, methods, epsilons, chosen, tune_epsilons) -> list:
  """(method, against, epsilon, `verdicts.PairedDifference`) of each verdict.

  `runs`: {(method, epsilon): {seed: verdicts.Run}} of the final runs;
  `chosen`: `choose`'s cells and validation means. In order: every method
  against tuned TFF `dp_aggregator` (`BASELINE`); then the default against
  TFF's default, against the best tuned tff_clip method and against the best
  tuned TFF method, each best picked by validation accuracy at the tuned
  epsilon nearest (`best_tuned`), so the test seeds do not pick it; then
  every correlated-noise tff_clip method against its TFF counterpart under
  the same participation (`counterpart`: TFF's `tree_adaptive` for an
  adaptive norm); then every BLT method against the banded method with the
  same bounding (`BLT_AGAINST_BANDED`); then every banded or BLT method
  against independent noise with its bounding (`INDEPENDENT_COUNTERPART`).
  A comparison of which one side did not run is left out.
  """
  out = []

  def add(method, against, label, epsilon):
    if (method, epsilon) in runs and (against, epsilon) in runs:
      out.append((method, label, epsilon, verdicts.compare(
          runs[method, epsilon], runs[against, epsilon])))

  for method in methods:
    if method != BASELINE:
      for epsilon in epsilons:
        add(method, BASELINE, TUNED_BASELINE, epsilon)
  for epsilon in epsilons:
    add(DEFAULT, TFF_DEFAULT, f'{TFF_DEFAULT} (untuned)', epsilon)
    add(DEFAULT_HELD, TFF_DEFAULT, f'{TFF_DEFAULT} (untuned)', epsilon)
    add(DEFAULT_HELD, DEFAULT, f'{DEFAULT} (damped step)', epsilon)
  for tff, family in ((False, 'tff_clip'), (True, 'TFF')):
    for epsilon in epsilons:
      tuned_at = nearest(epsilon, tune_epsilons)
      best = best_tuned(methods, chosen, tuned_at, tff)
      if best is not None:
        add(DEFAULT, best, f'{best} (best tuned {family})', epsilon)
  # The correlated methods under their own participation (the same seed: the
  # same groups and cohorts): against TFF's correlated factory, and BLT
  # against banded noise.
  for method in methods:
    if correlated(method) and not tff_method(method):
      for epsilon in epsilons:
        add(method, counterpart(method), f'{counterpart(method)} (tuned)',
            epsilon)
  for method in methods:
    if method in BLT_AGAINST_BANDED:
      for epsilon in epsilons:
        add(method, BLT_AGAINST_BANDED[method],
            f'{BLT_AGAINST_BANDED[method]} (tuned)', epsilon)
  # Each correlated method against independent noise with its bounding
  # (Poisson sampling: amplified, the cohort's expected size the same).
  for method in methods:
    independent = INDEPENDENT_COUNTERPART.get(method)
    if independent is not None:
      for epsilon in epsilons:
        add(method, independent, f'{independent} (tuned, independent noise)',
            epsilon)
  return out


def format_frontier(rows, epsilons):
  head = ('| method | ' + ' | '.join(f'ε = {e:g}' for e in epsilons) +
          ' | cohort |')
  lines = [head, '|---|' + '---:|' * (len(epsilons) + 1)]
  for row in rows:
    cells = [f'{row[f"eps{e:g}_mean"]:.4f} ± {row[f"eps{e:g}_std"]:.4f}'
             for e in epsilons]
    lines.append(f'| {row["method"]} | ' + ' | '.join(cells) +
                 f' | {row.get("cohort", "")} |')
  return '\n'.join(lines)


def plot(rows, epsilons, ceiling, path, title):
  with outputs.figure(path, figsize=(8, 5)) as (_, ax):
    for row in rows:
      style = dict(marker='s' if correlated(row['method']) else 'o')
      if row['method'].startswith('tff'):
        style['linestyle'] = '--'
      ax.errorbar(epsilons, [row[f'eps{e:g}_mean'] for e in epsilons],
                  yerr=[row[f'eps{e:g}_std'] for e in epsilons],
                  capsize=3, label=row['method'], **style)
    if ceiling is not None:
      ax.axhline(ceiling[0], color='grey', linestyle=':',
                 label=f'no DP ({ceiling[0]:.3f})')
    ax.set_xscale('log', base=2)
    ax.set_xticks(epsilons)
    ax.set_xticklabels([f'{e:g}' for e in epsilons])
    ax.set_xlabel('epsilon (calibrated by the accountant)')
    ax.set_ylabel('test accuracy (mean ± std over seeds)')
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _floats(values, name):
  try:
    out = [float(v) for v in values]
  except ValueError:
    raise ValueError(f'--{name} must be numbers; got {values}.') from None
  if not out or min(out) <= 0:
    raise ValueError(f'--{name} must be positive numbers; got {values}.')
  return out


def main(argv):
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {argv[1:]}')
  epsilons = _floats(_EPSILONS.value, 'epsilons')
  tune_epsilons = (_floats(_TUNE_EPSILONS.value, 'tune_epsilons')
                   if _TUNE_EPSILONS.value else list(epsilons))
  methods = list(_METHODS.value) or list(METHODS)
  unknown = [m for m in methods if m not in METHODS]
  if unknown:
    return cli.fail(f'--methods: unknown {unknown}; choose from '
                    f'{", ".join(METHODS)}.')
  for name in ('tuning_seeds', 'final_seeds', 'jobs'):
    if flags.FLAGS[name].value is not None and flags.FLAGS[name].value <= 0:
      return cli.fail(f'--{name} must be positive.')
  jobs = trainings.cores() if _JOBS.value is None else _JOBS.value
  tuning_seeds = [TUNING_SEED_BASE + s for s in range(_TUNING_SEEDS.value)]
  final_seeds = list(range(_FINAL_SEEDS.value))
  quick = _QUICK.value
  if quick:
    methods = list(_METHODS.value) or list(QUICK_METHODS)
    epsilons = tune_epsilons = epsilons[-1:]
    tuning_seeds, final_seeds = tuning_seeds[:1], final_seeds[:1]
  setting = _SETTING.value
  root = os.path.join(_ROOT.value, setting)
  try:
    learning_rates = _floats(_LEARNING_RATES.value, 'server_learning_rates')
  except ValueError as e:
    return cli.fail(e)
  try:
    quantiles = [None if q == NOISE_FOLLOWING else float(q)
                 for q in _QUANTILES.value]
  except ValueError:
    quantiles = []
  if not quantiles or not all(q is None or 0 <= q <= 1 for q in quantiles):
    return cli.fail('--target_quantiles must be numbers in [0, 1] or '
                    f"'{NOISE_FOLLOWING}'; got {_QUANTILES.value}.")
  cells = {m: grid(m, learning_rates, quantiles) for m in methods}
  if _CEILING.value:
    cells[CEILING] = grid(CEILING)  # The ceiling: always the frontier's grid.
  if quick:
    cells = {m: cell[:2] for m, cell in cells.items()}

  # 1. Tune: every cell, every tuning epsilon, every tuning seed.
  try:
    tune_plan = tuning_plan(setting, methods, cells, tune_epsilons,
                            tuning_seeds, root, quick)
  except config_lib.ConfigError as e:
    return cli.fail(e)
  # A method's trainings at one epsilon share their DP events: one worker.
  tuned = trainings.run_all([plan[3] for plan in tune_plan], jobs, 'tune',
                            groups=[plan[:2] for plan in tune_plan])
  chosen, tuning_rows = choose(tune_plan, [acc for acc, _ in tuned], cells)
  if tuning_rows:  # None where only untuned methods run, without a ceiling.
    outputs.write_csv(os.path.join(root, 'tuning.csv'), tuning_rows)

  # 2. Report: each method's chosen cell on fresh seeds, on the test set.
  try:
    final_plan = []
    for method in methods:
      for epsilon in epsilons:
        i = (0 if method in UNTUNED else
             chosen[method, nearest(epsilon, tune_epsilons)][0])
        final_plan += [(method, epsilon, make_config(
            setting, method, cells[method][i], epsilon, seed, 'final', root,
            quick)) for seed in final_seeds]
    if _CEILING.value:
      final_plan += [(CEILING, None, make_config(
          setting, CEILING, cells[CEILING][chosen[CEILING, None][0]], None,
          seed, 'final', root, quick)) for seed in final_seeds]
    # The title's population, rounds and cohort: the setting's (a ceiling
    # run's, trained or not; a correlated method's cohort is smaller).
    first = make_config(setting, CEILING, {}, None, final_seeds[0], 'final',
                        root, quick)
  except config_lib.ConfigError as e:
    return cli.fail(e)
  finals = trainings.run_all([plan[2] for plan in final_plan], jobs, 'final',
                             groups=[plan[:2] for plan in final_plan])
  runs = collections.defaultdict(dict)  # (method, epsilon): {seed: Run}
  spent = collections.defaultdict(list)
  cohorts = collections.defaultdict(list)
  for (method, epsilon, config), (acc, measured) in zip(final_plan, finals):
    cohorts[method].append(config.clients_per_round)
    # The noise is calibrated to the target by the accountant the run
    # reports (`tff_clip.program.preflight`): its ledger may report a little
    # less (the calibration's tolerance), never more.
    if epsilon is not None and measured > epsilon * (1 + 1e-3):
      return cli.fail(f'{method} at epsilon {epsilon:g} spent {measured}.')
    runs[method, epsilon][config.seed] = verdicts.Run(
        acc, verdicts.fresh_noise_key(config.output_dir))
    spent[method, epsilon].append(measured)
  compared = comparisons(runs, methods, epsilons, chosen, tune_epsilons)
  against_baseline = {(method, epsilon): d
                      for method, against, epsilon, d in compared
                      if against == TUNED_BASELINE}
  rows = []
  for method in methods:
    row = collections.OrderedDict(method=method)
    for epsilon in epsilons:
      prefix = f'eps{epsilon:g}_'
      row[prefix + 'mean'], row[prefix + 'std'] = _mean_std(
          [run.accuracy for run in runs[method, epsilon].values()])
      row[prefix + 'spent'] = max(spent[method, epsilon])
      # The paired difference from tuned TFF `dp_aggregator` (none for
      # itself, or where it did not run).
      row.update(verdicts.csv_fields(
          against_baseline.get((method, epsilon)), prefix))
    # The clients per round of its final runs (a correlated method's: the
    # smallest group of each seed, `separated_cohort`).
    row['cohort'] = benchmark_settings.cohort_range(cohorts[method])
    rows.append(row)
  ceiling = (_mean_std([run.accuracy for run in runs[CEILING, None].values()])
             if _CEILING.value else None)
  outputs.write_csv(os.path.join(root, 'frontier.csv'), rows)
  written = ['tuning.csv'] * bool(tuning_rows) + ['chosen.md', 'frontier.csv']
  if compared:
    outputs.write_csv(os.path.join(root, 'verdicts.csv'), [
        collections.OrderedDict(method=method, against=against,
                                epsilon=epsilon, **verdicts.csv_fields(d))
        for method, against, epsilon, d in compared])
    written.append('verdicts.csv')
  seeds = f'{len(final_seeds)} seed' + 's' * (len(final_seeds) > 1)
  table = (f'Test accuracy, mean ± std over {seeds}:\n\n' +
           format_frontier(rows, epsilons))
  ceiling_line = (f'Non-private ceiling (same model and rounds, tuned server '
                  f'learning rate): {ceiling[0]:.4f} ± {ceiling[1]:.4f}.'
                  if ceiling else 'Non-private ceiling: not run (--noceiling).')
  under = [f'{row["method"]}: ' + ' / '.join(
      f'{row[f"eps{e:g}_spent"]:.3g}' for e in epsilons) for row in rows
           if any(row[f'eps{e:g}_spent'] < e * (1 - 1e-3) for e in epsilons)]
  if under:
    ceiling_line += ('\nEpsilon the ledgers report where more than 0.1% '
                     'below the target: ' +
                     '; '.join(under) + '.')
  verdict_text = (verdicts.format_report(compared) if compared else
                  'No verdicts: --methods holds no pair to compare.')
  with open(os.path.join(root, 'frontier.md'), 'w') as f:
    f.write(table + '\n\n' + ceiling_line + '\n\n' + verdict_text + '\n')
  chosen_lines = [
      f'Grid (every method): server learning rate {tuple(learning_rates)}; '
      f'target quantile ({", ".join(_label(q) for q in quantiles)}) '
      f'(adaptive norms) or clip norm {FIXED_NORMS} (fixed norms). Tuned at '
      f'epsilon {tune_epsilons} on seeds {tuning_seeds} (validation split); '
      f'reported on seeds {final_seeds} (test set).' + (
          f' Untuned, at their libraries\' defaults: '
          f'{", ".join(m for m in methods if m in UNTUNED)}.'
          if any(m in UNTUNED for m in methods) else ''), '',
      '| method | tuned at ε | chosen | validation accuracy |',
      '|---|---:|---|---:|']
  for (method, epsilon), (i, mean) in sorted(
      chosen.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
    chosen_lines.append(f'| {method} | {"-" if epsilon is None else f"{epsilon:g}"} '
                        f'| {cell_name(cells[method][i])} | {mean:.4f} |')
  same_cell = format_same_cell(same_cell_leads(tuning_rows))
  chosen_lines += ['', 'Untuned: each method against its TFF counterpart at '
                   'the same grid cell (validation accuracy, points).', '',
                   same_cell]
  with open(os.path.join(root, 'chosen.md'), 'w') as f:
    f.write('\n'.join(chosen_lines) + '\n')
  plot(rows, epsilons, ceiling, os.path.join(root, 'frontier.png'),
       f'{setting}: {first.num_clients} clients, {first.rounds} rounds x '
       f'{first.clients_per_round}, δ = {first.delta:g}, {seeds}')
  print('\n\n'.join(['\n'.join(chosen_lines), table, ceiling_line,
                     verdict_text]))
  print(f'outputs: {root}/' + ', '.join(written + ['frontier.md',
                                                   'frontier.png']))
  return 0


if __name__ == '__main__':
  cli.run(main, interrupted=cli.RESUMES_ITS_RUNS)
