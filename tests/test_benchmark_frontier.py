"""Specification of the privacy-utility frontier (`scripts.benchmark_frontier`)."""

import ast
import csv
import importlib.util
import json
import math
import os
import pathlib

import pytest
from scipy import stats

import as_a_user  # pylint: disable=g-bad-import-order
from scripts import verdicts
from tff_clip.program import config as config_lib


def _python(code):
  result = as_a_user.python(code)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.mark.parametrize('setting', ['mnist1000', 'digits1000',
                                     'digits_heldout', 'mnist_heldout'])
def test_every_method_is_tuned_on_the_same_grid_on_validation_data(
    tmp_path, setting):
  _python(f'''
import numpy as np
from scripts import benchmark_frontier as b
from tasks import names
from tff_clip.privacy import sampling
cells = {{m: b.grid(m) for m in list(b.METHODS) + [b.CEILING]}}
plan = b.tuning_plan({setting!r}, list(b.METHODS), cells, [2.0, 8.0],
                     [1000, 1001], {str(tmp_path)!r}, False)
tuned = [m for m in b.METHODS if m not in b.UNTUNED]
sizes = {{len(cells[m]) for m in tuned}}
assert sizes == {{9}}, sizes
for m in tuned:
  assert sorted({{c['server_learning_rate'] for c in cells[m]}}) == sorted(
      b.SERVER_LEARNING_RATES)
# The untuned defaults run no tuning.
assert len(plan) == len(tuned) * 2 * 9 * 2 + len(cells[b.CEILING]) * 2
for method, epsilon, i, config in plan:
  assert config.eval_split == 'validation'
  assert config.validation_fraction > 0
  assert config.seed >= b.TUNING_SEED_BASE
  assert config.num_clients >= 1000
  setting_cohort = b.SETTINGS[{setting!r}]['clients_per_round']
  if b.correlated(method):
    # Correlated noise: every client takes part at most every b rounds, as
    # often as Poisson sampling would take it, with as many bands.
    assert config.sampling == 'min_separation'
    assert config.separation == config.bands == (
        config.num_clients // setting_cohort)
    assert config.noise_mechanism in ('banded', 'blt', 'tree')
    # b = N / cohort equal groups (`sampling.separation_groups`): the
    # whole setting's cohort trains, as under independent noise.
    groups = np.bincount(sampling.separation_groups(
        names.client_ids(config.task, config.data_source, config.num_clients),
        config.separation, config.seed))
    assert groups.tolist() == [setting_cohort] * config.separation
    assert config.clients_per_round == setting_cohort
    sampling.ClientSampler(names.client_ids(config.task, config.data_source,
                                            config.num_clients),
                           config.clients_per_round, config.sampling,
                           config.seed, config.separation)
  else:
    assert config.clients_per_round == setting_cohort
    assert config.sampling == 'poisson'
    assert config.noise_mechanism == 'independent'
  if method == b.CEILING:
    assert not config.private
  else:
    assert config.target_epsilon == epsilon and config.noise_multiplier is None
    assert config.delta <= 1 / config.num_clients
final = b.make_config({setting!r}, 'tff_adaptive', cells['tff_adaptive'][0],
                      4.0, 0, 'final', {str(tmp_path)!r}, False)
assert final.eval_split == 'test' and final.seed < b.TUNING_SEED_BASE
assert final.validation_fraction == plan[0][3].validation_fraction
''')
  assert not os.listdir(tmp_path)  # Planning writes nothing.


def test_the_chosen_cell_has_the_best_mean_over_tuning_seeds():
  out = _python('''
from scripts import benchmark_frontier as b
cells = {'clip_fixed': [dict(clip_norm=0.1), dict(clip_norm=1.0),
                        dict(clip_norm=3.0)]}
plan = [('clip_fixed', 4.0, i, None) for i in (0, 0, 1, 1, 2, 2)]
# Cell 1 holds the best single run (0.9), cell 2 the best mean (0.7).
chosen, rows = b.choose(plan, [0.5, 0.5, 0.9, 0.3, 0.7, 0.7], cells)
print(chosen[('clip_fixed', 4.0)][0], len(rows))
# A tie keeps the earlier cell.
chosen, _ = b.choose(plan, [0.6, 0.6, 0.6, 0.6, 0.1, 0.1], cells)
print(chosen[('clip_fixed', 4.0)][0])
''')
  assert out.split() == ['2', '3', '0']


def test_same_cell_leads_compare_each_method_with_its_tff_counterpart():
  out = _python('''
from scripts import benchmark_frontier as b
row = lambda m, e, cell, acc: dict(method=m, epsilon=e, cell=cell,
                                   validation_accuracy=acc, seeds=2)
rows = [row('tff_adaptive', 4.0, 'q0.1', 0.60), row('tff_adaptive', 4.0, 'q0.3', 0.50),
        row('tff_adaptive', 4.0, 'q0.7', 0.40),
        row('normalize_adaptive', 4.0, 'q0.1', 0.55),
        row('normalize_adaptive', 4.0, 'q0.3', 0.60),
        row('normalize_adaptive', 4.0, 'q0.7', 0.70),
        row('tff_fixed', 4.0, 'c1', 0.5), row('normalize_fixed', 4.0, 'c1', 0.5),
        row('tff_tree_adaptive', 4.0, 'q0.1', 0.3),
        row('banded_normalize_adaptive', 4.0, 'q0.1', 0.5),
        row('no_dp', '', 'lr1', 0.9)]
for r in b.same_cell_leads(rows):
  print(r['method'], r['counterpart'], r['cells'], r['cells_led'],
        round(r['median_lead'], 6), round(r['min_lead'], 6),
        round(r['max_lead'], 6))
''')
  # Leads: -5, +10, +30 points against tff_adaptive; a tie (not a lead)
  # against tff_fixed; banded noise against TFF's tree aggregation (the same
  # participation), not against independent noise; TFF methods and the
  # ceiling are not compared.
  assert out.splitlines() == [
      'normalize_adaptive tff_adaptive 3 2 10.0 -5.0 30.0',
      'normalize_fixed tff_fixed 1 0 0.0 0.0 0.0',
      'banded_normalize_adaptive tff_tree_adaptive 1 1 20.0 20.0 20.0']


def _runs(accuracies, fresh=True):
  return {seed: verdicts.Run(accuracy, fresh)
          for seed, accuracy in accuracies.items()}


def test_the_interval_is_students_t_over_the_paired_differences():
  # Paired differences 1, 2, 3, 4, 5 points (the other side varies widely,
  # the difference does not): mean 3, s = sqrt(2.5), t(0.975, 4) = 2.7764
  # (the published table), so 3 -+ 2.7764 sqrt(2.5) / sqrt(5) = 3 -+ 1.9632.
  theirs = {0: 0.40, 1: 0.70, 2: 0.50, 3: 0.60, 4: 0.30}
  ours = {s: theirs[s] + (s + 1) / 100 for s in theirs}
  d = verdicts.compare(_runs(ours), _runs(theirs))
  assert (d.seeds, d.fresh, d.unpaired) == (5, 5, ())
  assert d.difference == pytest.approx(3.0)
  assert d.low == pytest.approx(3 - 1.9632, abs=1e-4)
  assert d.high == pytest.approx(3 + 1.9632, abs=1e-4)
  # scipy's interval of the mean over the same 20 differences.
  differences = [((7 * s) % 11 - 4) / 3 for s in range(20)]
  mean = sum(differences) / 20
  sem = stats.sem(differences)
  low, high = stats.t.interval(0.95, 19, loc=mean, scale=sem)
  d = verdicts.compare(_runs({s: 0.5 + x / 100 for s, x in
                              enumerate(differences)}),
                       _runs({s: 0.5 for s in range(20)}))
  assert (d.low, d.high) == (pytest.approx(low), pytest.approx(high))
  assert d.half_width == pytest.approx((high - low) / 2)


@pytest.mark.parametrize('low, high, called', [
    (1e-9, 3.0, 'win'), (0.0, 3.0, 'tie'), (-3.0, 0.0, 'tie'),
    (-3.0, -1e-9, 'loss'), (-1.0, 1.0, 'tie'), (2.0, 2.0, 'win'),
    (None, None, 'n/a')])
def test_the_verdict_is_read_from_the_interval_alone(low, high, called):
  assert verdicts.verdict(low, high) == called


def test_a_verdict_follows_the_interval_not_the_mean():
  # The same mean difference, +2 points: decided by 20 steady pairs, not
  # by 5 scattered ones (whose interval holds 0), and shown with its
  # half-width so a reader sees how far the seeds were from deciding.
  steady = verdicts.compare(
      _runs({s: 0.52 + (s % 2 - 0.5) / 100 for s in range(20)}),
      _runs({s: 0.50 for s in range(20)}))
  scattered = verdicts.compare(
      _runs({0: 0.62, 1: 0.42, 2: 0.57, 3: 0.47, 4: 0.52}),
      _runs({s: 0.50 for s in range(5)}))
  assert steady.difference == pytest.approx(2.0)
  assert scattered.difference == pytest.approx(2.0)
  assert steady.verdict == 'win' and scattered.verdict == 'tie'
  assert verdicts.cells(scattered)[4] == (
      f'tie (± {scattered.half_width:.1f})')
  assert verdicts.cells(steady)[4] == 'win'
  # One pair has no interval: no verdict.
  single = verdicts.compare(_runs({0: 0.9}), _runs({0: 0.1}))
  assert single.verdict == 'n/a' and single.low is None


def test_seeds_are_paired_and_a_seed_on_one_side_only_is_left_out_and_named():
  ours = _runs({0: 0.90, 1: 0.60, 2: 0.70, 3: 0.80})
  theirs = _runs({1: 0.55, 2: 0.65, 3: 0.75, 5: 0.10})
  d = verdicts.compare(ours, theirs)
  # Seeds 1-3 pair, each 5 points ahead (the means of all runs differ by
  # 23.75 points: seeds 0 and 5 count for nothing).
  assert (d.seeds, d.unpaired) == (3, (0, 5))
  assert d.difference == pytest.approx(5.0)
  assert d.low == pytest.approx(5.0) and d.high == pytest.approx(5.0)
  report = verdicts.format_report([('ours', 'theirs', 4.0, d)])
  assert ('ours against theirs at ε = 4: seeds [0, 5] ran on one side only '
          'and are left out.') in report.splitlines()
  assert '| ours | theirs | 4 | +5.0 | [+5.0, +5.0] | 3 | 3 of 3 | win |' in (
      report)


def test_fresh_noise_keys_are_counted_from_each_runs_config_json(tmp_path):
  def record(name, **fields):
    run_dir = tmp_path / name
    run_dir.mkdir()
    config = config_lib.TrainConfig(experiment_name=name, **fields)
    (run_dir / 'config.json').write_text(json.dumps(config.to_json()))
    return str(run_dir)

  fresh = record('fresh', target_epsilon=4.0)
  seeded = record('seeded', target_epsilon=4.0, noise_seed=7)
  tff = record('tff', target_epsilon=4.0, bounding='tff_gaussian')
  legacy = tmp_path / 'legacy'  # Recorded before --noise_seed existed.
  legacy.mkdir()
  (legacy / 'config.json').write_text(json.dumps({'seed': 0}))
  assert [verdicts.fresh_noise_key(d) for d in (fresh, seeded, tff,
                                                str(legacy))] == [
      True, False, True, True]
  # A pair is fresh only when both its runs drew their own key.
  key = verdicts.fresh_noise_key
  ours = {0: verdicts.Run(0.6, key(fresh)), 1: verdicts.Run(0.6, key(seeded)),
          2: verdicts.Run(0.6, key(fresh))}
  theirs = {0: verdicts.Run(0.5, key(tff)), 1: verdicts.Run(0.5, key(tff)),
            2: verdicts.Run(0.5, key(seeded))}
  d = verdicts.compare(ours, theirs)
  assert (d.fresh, d.seeds) == (1, 3)
  assert verdicts.cells(d)[3] == '1 of 3'
  with pytest.raises(ValueError, match='not a readable run configuration'):
    verdicts.fresh_noise_key(str(tmp_path / 'missing'))


def test_the_default_is_judged_against_tff_default_and_the_best_tuned():
  out = _python('''
from scripts import benchmark_frontier as b
from scripts import verdicts
methods = ['tff_adaptive', 'tff_fixed', 'clip_fixed', 'normalize_fixed',
           'default', 'tff_default']
runs = {(m, e): {s: verdicts.Run(0.5 + 0.01 * i + 0.001 * s, True)
                 for s in range(3)}
        for i, m in enumerate(methods) for e in (2.0, 8.0)}
# On validation (tuned at 4) normalize_fixed beats clip_fixed and tff_fixed
# beats tff_adaptive; on test clip_fixed leads: validation picks the best.
chosen = {('tff_adaptive', 4.0): (0, 0.60), ('tff_fixed', 4.0): (0, 0.70),
          ('clip_fixed', 4.0): (0, 0.65), ('normalize_fixed', 4.0): (0, 0.66)}
for method, against, epsilon, d in b.comparisons(runs, methods, [2.0, 8.0],
                                                 chosen, [4.0]):
  print(method, against.replace(' ', '_'), epsilon, round(d.difference, 6),
        d.seeds)
''')
  assert out.splitlines() == [
      # Every method against tuned dp_aggregator (not itself), ...
      'tff_fixed tff_adaptive_(tuned) 2.0 1.0 3',
      'tff_fixed tff_adaptive_(tuned) 8.0 1.0 3',
      'clip_fixed tff_adaptive_(tuned) 2.0 2.0 3',
      'clip_fixed tff_adaptive_(tuned) 8.0 2.0 3',
      'normalize_fixed tff_adaptive_(tuned) 2.0 3.0 3',
      'normalize_fixed tff_adaptive_(tuned) 8.0 3.0 3',
      'default tff_adaptive_(tuned) 2.0 4.0 3',
      'default tff_adaptive_(tuned) 8.0 4.0 3',
      'tff_default tff_adaptive_(tuned) 2.0 5.0 3',
      'tff_default tff_adaptive_(tuned) 8.0 5.0 3',
      # ... and the default against TFF's, and against the best tuned of
      # each library on validation.
      'default tff_default_(untuned) 2.0 -1.0 3',
      'default tff_default_(untuned) 8.0 -1.0 3',
      'default normalize_fixed_(best_tuned_tff_clip) 2.0 1.0 3',
      'default normalize_fixed_(best_tuned_tff_clip) 8.0 1.0 3',
      'default tff_fixed_(best_tuned_TFF) 2.0 3.0 3',
      'default tff_fixed_(best_tuned_TFF) 8.0 3.0 3']


def test_the_untuned_defaults_are_each_librarys_own():
  tff = pathlib.Path(importlib.util.find_spec(
      'tensorflow_federated').submodule_search_locations[0])
  source = (tff / 'python/aggregators/differential_privacy.py').read_text()
  [method] = [node for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.FunctionDef) and
              node.name == 'gaussian_adaptive']
  names = [a.arg for a in method.args.args][-len(method.args.defaults):]
  tff_defaults = {name: ast.literal_eval(value)
                  for name, value in zip(names, method.args.defaults)}
  out = _python('''
import json
from scripts import benchmark_frontier as b
from tff_clip.program import config
default = b.make_config('mnist1000', 'default', {}, 4.0, 3, 'final', '/tmp/x',
                        False)
tff = b.make_config('mnist1000', 'tff_default', {}, 4.0, 3, 'final',
                    '/tmp/x', False)
fields = ('bounding', 'clip_norm', 'target_quantile', 'initial_clip_norm',
          'clip_learning_rate', 'clipped_count_stddev', 'server_learning_rate')
library = config.TrainConfig()
print(json.dumps(dict(
    default=[getattr(default, f) for f in fields],
    library=[getattr(library, f) for f in fields],
    tff=[getattr(tff, f) for f in fields], name=tff.experiment_name,
    plan=[p[0] for p in b.tuning_plan('mnist1000', ['default', 'tff_default'],
                                      {'no_dp': b.grid('no_dp')}, [4.0],
                                      [1000], '/tmp/x', False)],
    final_seeds=b._FINAL_SEEDS.default)))
''')
  got = json.loads(out)
  # tff_clip's default sets nothing: TrainConfig's defaults throughout.
  assert got['default'] == got['library']
  # TFF's: gaussian_adaptive at its signature's defaults (dp_aggregator's),
  # at the same server learning rate as tff_clip's default.
  assert got['tff'] == ['tff_gaussian', 'adaptive',
                        tff_defaults['target_unclipped_quantile'],
                        tff_defaults['initial_l2_norm_clip'],
                        tff_defaults['learning_rate'],
                        tff_defaults['clipped_count_stddev'],
                        got['library'][-1]]
  assert got['name'] == 'tff_default_eps4_seed3'
  assert set(got['plan']) == {'no_dp'}  # Untuned: no tuning runs.
  assert got['final_seeds'] == 20


def test_noise_following_grid_value_leaves_the_quantile_to_the_default_rule():
  out = _python('''
import json
from scripts import benchmark_frontier as b
[cell] = b.grid('clip_adaptive', [1.0], [None])
clip = b.make_config('digits1000', 'clip_adaptive', cell, 4.0, 1000, 'tune',
                     '/tmp/x', False)
default = b.make_config('digits1000', 'default', {}, 4.0, 1000, 'tune',
                        '/tmp/x', False)
print(json.dumps(dict(quantiles=[clip.target_quantile,
                                 default.target_quantile],
                      name=clip.experiment_name)))
''')
  got = json.loads(out)
  # Unset on both: the run resolves it from its own z, cohort and model size.
  assert got['quantiles'] == [None, None]
  assert got['name'] == (
      'clip_adaptive_eps4_server_learning_rate1_target_quantilenoise_seed1000')


@pytest.mark.slow
def test_quick_run_tunes_reports_and_resumes(tmp_path):
  command = ['-m', 'scripts.benchmark_frontier', '--quick',
             f'--root_output_dir={tmp_path}']
  first = as_a_user.run(command)
  assert first.returncode == 0, first.stderr[-3000:]
  assert 'round 1/' not in first.stdout  # The trainings run quietly.
  root = tmp_path / 'mnist1000'
  for name in ('tuning.csv', 'chosen.md', 'frontier.csv', 'verdicts.csv',
               'frontier.md', 'frontier.png'):
    assert (root / name).exists(), name
  with open(root / 'frontier.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [r['method'] for r in rows] == ['tff_adaptive', 'normalize_adaptive']
  # The baseline is not compared with itself; one seed pairs, whose key the
  # run records say was fresh, and gives no interval.
  assert rows[0]['eps8_verdict'] == ''
  assert (rows[1]['eps8_seeds'], rows[1]['eps8_fresh_keys'],
          rows[1]['eps8_verdict']) == ('1', '1', 'n/a')
  assert float(rows[1]['eps8_difference']) == pytest.approx(
      100 * (float(rows[1]['eps8_mean']) - float(rows[0]['eps8_mean'])))
  assert 'Student t' in (root / 'frontier.md').read_text()
  assert (root / 'verdicts.csv').exists()
  assert [r['cohort'] for r in rows] == ['50', '50']  # Poisson: the setting's.
  # Two runs per method and the ceiling's two tuning runs, then one final
  # run each: every one is a run directory.
  assert len(os.listdir(root / 'tune')) == 6
  assert len(os.listdir(root / 'final')) == 3
  # A rerun trains nothing again and prints the same table.
  stamps = {p: p.stat().st_mtime for p in root.glob('*/*/summary.json')}
  again = as_a_user.run(command)
  assert again.returncode == 0, again.stderr[-3000:]
  assert {p: p.stat().st_mtime for p in root.glob('*/*/summary.json')} == (
      stamps)
  table = lambda out: out[out.index('| method | ε = 8'):]
  assert table(again.stdout) == table(first.stdout)


@pytest.mark.slow
def test_without_the_ceiling_untuned_methods_train_only_their_final_runs(
    tmp_path):
  result = as_a_user.run(['-m', 'scripts.benchmark_frontier', '--quick',
                          '--methods=default,tff_default', '--noceiling',
                          f'--root_output_dir={tmp_path}'])
  assert result.returncode == 0, result.stderr[-3000:]
  root = tmp_path / 'mnist1000'
  # Nothing is tuned: one final run per method, no ceiling run anywhere.
  assert not (root / 'tune').exists() and not (root / 'tuning.csv').exists()
  finals = sorted(p.name.split('_eps')[0] for p in (root / 'final').iterdir())
  assert finals == ['default', 'tff_default']
  report = (root / 'frontier.md').read_text()
  assert 'Non-private ceiling: not run (--noceiling).' in report
  with open(root / 'verdicts.csv', newline='') as f:
    verdicts_ = [(r['method'], r['against'], r['seeds'])
                 for r in csv.DictReader(f)]
  assert verdicts_ == [('default', 'tff_default (untuned)', '1')]
  assert (root / 'frontier.png').exists()
  assert 'tuning.csv' not in result.stdout.splitlines()[-1]


@pytest.mark.slow
def test_ctrl_c_stops_every_parallel_run_at_once_in_one_line(tmp_path):
  command = ['-m', 'scripts.benchmark_frontier', '--quick',
             '--setting=digits1000', '--jobs=2',
             f'--root_output_dir={tmp_path}']
  proc = as_a_user.start(command, process_group=0)
  rest = as_a_user.interrupt_at(proc, '[tune 1/6]')
  assert rest == ('interrupted: rerun the same command to resume (finished '
                  'runs are reused, interrupted runs resume)\n')
  assert proc.returncode == 130
  # Stopped, not left to start the queued tuning runs (6; 2 at a time).
  assert len(os.listdir(tmp_path / 'digits1000' / 'tune')) < 6


@pytest.mark.slow
def test_correlated_methods_run_under_the_same_protocol(tmp_path):
  result = as_a_user.run(
      ['-m', 'scripts.benchmark_frontier', '--quick',
       '--methods=banded_normalize_adaptive,tff_tree_adaptive',
       f'--root_output_dir={tmp_path}'])
  assert result.returncode == 0, result.stderr[-3000:]
  root = tmp_path / 'mnist1000'
  with open(root / 'frontier.csv', newline='') as f:
    rows = {r['method']: r for r in csv.DictReader(f)}
  # Calibrated to epsilon 8 by the accountant the ledger reports: every run
  # spends the target (banded noise with an adaptive norm too: its count
  # noise is charged at the mechanism's sensitivity), none more.
  for row in rows.values():
    assert 0.995 * 8 <= float(row['eps8_spent']) <= 8 * (1 + 1e-3)
  assert 'below the target' not in (root / 'frontier.md').read_text()
  # Untuned, banded noise is compared with TFF's tree aggregation.
  assert '| banded_normalize_adaptive | 8 | tff_tree_adaptive |' in (
      root / 'chosen.md').read_text()
  [run] = (root / 'final').glob('banded_normalize_adaptive_*')
  config = json.loads((run / 'config.json').read_text())
  assert (config['sampling'], config['noise_mechanism'], config['bands']) == (
      'min_separation', 'banded', 20)
  # The 20 groups hold 50 of the 1,000 clients each: the cohort is the
  # setting's 50, as under independent noise, and it is recorded.
  assert config['clients_per_round'] == 50
  assert rows['banded_normalize_adaptive']['cohort'] == '50'
  assert rows['tff_tree_adaptive']['cohort'] == '50'
  assert '| 50 |' in (root / 'frontier.md').read_text()


@pytest.mark.parametrize('flag, message', [
    ('--methods=tff_magic', '--methods: unknown'),
    ('--epsilons=2,x', '--epsilons must be numbers'),
    ('--epsilons=0', '--epsilons must be positive'),
    ('--final_seeds=0', '--final_seeds must be positive'),
    ('--jobs=0', '--jobs must be positive'),
    ('--target_quantiles=0.3,1.5', '--target_quantiles must be numbers in'),
    ('--target_quantiles=half', '--target_quantiles must be numbers in'),
    ('--target_quantiles=Noise', '--target_quantiles must be numbers in'),
    ('--server_learning_rates=0', '--server_learning_rates must be positive'),
])
def test_bad_flag_is_one_line_exit_2(tmp_path, flag, message):
  result = as_a_user.run(['-m', 'scripts.benchmark_frontier', flag,
                          f'--root_output_dir={tmp_path}'], timeout=120)
  assert result.returncode == 2
  assert result.stderr.count('\n') == 1 and message in result.stderr, (
      result.stderr)
  assert not os.listdir(tmp_path)


def test_correlated_methods_judged_against_tffs_tree_and_blt_against_banded():
  out = _python('''
from scripts import benchmark_frontier as b
from scripts import verdicts
methods = ['blt_normalize_adaptive', 'banded_normalize_adaptive',
           'tff_tree_adaptive', 'blt_normalize_fixed']
# TFF's tree ran seeds 1-3, the others 0-2: only seeds 1 and 2 pair with it.
runs = {(m, 4.0): {s: verdicts.Run(0.5 + 0.01 * i + 0.001 * s * (i + 1), True)
                   for s in (range(1, 4) if i == 2 else range(3))}
        for i, m in enumerate(methods)}
for method, against, epsilon, d in b.comparisons(runs, methods, [4.0], {},
                                                 [4.0]):
  print(method, against.replace(' ', '_'), epsilon, round(d.difference, 6),
        d.seeds)
''')
  # The differences, seed by seed: (0.01 (i - j) + 0.001 s (i - j)) x 100
  # points, averaged over the paired seeds s.
  assert out.splitlines() == [
      # tff_clip's correlated methods against TFF's tree, same participation,
      # on the seeds both ran (TFF's own method is not compared with
      # itself) ...
      'blt_normalize_adaptive tff_tree_adaptive_(tuned) 4.0 -2.3 2',
      'banded_normalize_adaptive tff_tree_adaptive_(tuned) 4.0 -1.15 2',
      # ... (a fixed norm's counterpart, TFF's fixed clipping, did not run:
      # no row), and BLT against banded noise with the same bounding; the
      # fixed BLT's banded twin did not run: no row.
      'blt_normalize_adaptive banded_normalize_adaptive_(tuned) 4.0 -1.1 3']


def test_banded_and_blt_are_judged_against_independent_noise_too():
  out = _python('''
from scripts import benchmark_frontier as b
from scripts import verdicts
methods = ['normalize_adaptive', 'banded_normalize_adaptive',
           'blt_normalize_adaptive']
runs = {(m, 4.0): {s: verdicts.Run(0.5 + 0.01 * i + 0.001 * s * (i + 1), True)
                   for s in range(3)} for i, m in enumerate(methods)}
for method, against, epsilon, d in b.comparisons(runs, methods, [4.0], {},
                                                 [4.0]):
  if 'independent' in against:
    print(method, against.replace(' ', '_'), round(d.difference, 6), d.seeds)
''')
  # (0.01 (i - j) + 0.001 s (i - j)) x 100 points, mean over s = 0, 1, 2.
  assert out.splitlines() == [
      'banded_normalize_adaptive '
      'normalize_adaptive_(tuned,_independent_noise) 1.1 3',
      'blt_normalize_adaptive '
      'normalize_adaptive_(tuned,_independent_noise) 2.2 3']


@pytest.mark.slow
def test_calibration_benchmark_runs_the_cell_calibrated_both_ways(tmp_path):
  result = as_a_user.run(['-m', 'scripts.benchmark_calibration', '--quick',
                          f'--root_output_dir={tmp_path}', '--jobs=1'])
  assert result.returncode == 0, result.stderr[-3000:]
  root = tmp_path / 'mnist1000_calibration'
  with open(root / 'calibration.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [r['method'] for r in rows] == ['default', 'tff_default']
  for row in rows:
    target = float(row['target_epsilon'])
    # The reported accountant spends the target; RDP's calibration, more
    # noise for less reported epsilon (dp_accounting's oracle in
    # tests/test_one_epsilon.py).
    assert 0.995 * target <= float(row['epsilon_reported']) <= target
    assert float(row['z_rdp']) > float(row['z_reported'])
    assert float(row['epsilon_rdp']) < 0.995 * target
  assert len(os.listdir(root / 'reported' / 'final')) == 2
  assert len(os.listdir(root / 'rdp' / 'final')) == 2
  # The RDP runs were given their noise: fixed z, no target, in the record.
  (run,) = [p for p in (root / 'rdp' / 'final').iterdir()
            if p.name.startswith('default_')]
  config = json.loads((run / 'config.json').read_text())
  assert json.dumps(config).count('"target_epsilon": null') >= 1
