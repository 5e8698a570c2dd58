"""Specification of the privacy-utility frontier (`scripts.benchmark_frontier`)."""

import csv
import json
import os

import pytest

import as_a_user  # pylint: disable=g-bad-import-order


def _python(code):
  result = as_a_user.python(code)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.mark.parametrize('setting', ['mnist1000', 'digits1000'])
def test_every_method_is_tuned_on_the_same_grid_on_validation_data(
    tmp_path, setting):
  _python(f'''
import collections
from scripts import benchmark_frontier as b
from tasks import names
from tff_clip import sampling
cells = {{m: b.grid(m) for m in list(b.METHODS) + [b.CEILING]}}
plan = b.tuning_plan({setting!r}, list(b.METHODS), cells, [2.0, 8.0],
                     [1000, 1001], {str(tmp_path)!r}, False)
sizes = {{len(cells[m]) for m in b.METHODS}}
assert sizes == {{9}}, sizes
for m in b.METHODS:
  assert sorted({{c['server_learning_rate'] for c in cells[m]}}) == sorted(
      b.SERVER_LEARNING_RATES)
assert len(plan) == len(b.METHODS) * 2 * 9 * 2 + len(cells[b.CEILING]) * 2
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
    assert config.noise_mechanism in ('banded', 'tree')
    # The cohort is the smallest of this seed's groups (the sampler refuses
    # a larger one), computed as the sampler groups them.
    groups = collections.Counter(
        sampling.separation_group(c, config.separation, config.seed)
        for c in names.client_ids(config.task, config.data_source,
                                  config.num_clients))
    assert len(groups) == config.separation
    assert config.clients_per_round == min(
        setting_cohort, min(groups.values())) < setting_cohort
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


@pytest.mark.slow
def test_quick_run_tunes_reports_and_resumes(tmp_path):
  command = ['-m', 'scripts.benchmark_frontier', '--quick',
             f'--root_output_dir={tmp_path}']
  first = as_a_user.run(command)
  assert first.returncode == 0, first.stderr[-3000:]
  assert 'round 1/' not in first.stdout  # The trainings run quietly.
  root = tmp_path / 'mnist1000'
  for name in ('tuning.csv', 'chosen.md', 'frontier.csv', 'frontier.md',
               'frontier.png'):
    assert (root / name).exists(), name
  with open(root / 'frontier.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [r['method'] for r in rows] == ['tff_adaptive', 'normalize_adaptive']
  assert float(rows[0]['eps8_lead']) == 0.0  # The baseline leads itself by 0.
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
  # Calibrated to epsilon 8 with the accountant's RDP bound: no run spends
  # more; the banded run's ledger (PLD) reports less, and says so.
  for row in rows.values():
    assert 0 < float(row['eps8_spent']) <= 8 * (1 + 1e-3)
  assert float(rows['banded_normalize_adaptive']['eps8_spent']) < 8
  assert 'banded_normalize_adaptive: 7.' in (root / 'frontier.md').read_text()
  # Untuned, banded noise is compared with TFF's tree aggregation.
  assert '| banded_normalize_adaptive | 8 | tff_tree_adaptive |' in (
      root / 'chosen.md').read_text()
  [run] = (root / 'final').glob('banded_normalize_adaptive_*')
  config = json.loads((run / 'config.json').read_text())
  assert (config['sampling'], config['noise_mechanism'], config['bands']) == (
      'min_separation', 'banded', 20)
  # Seed 0's 20 groups hold 31 to 65 of the 1,000 clients: the cohort is the
  # smallest group (not 50, which the sampler refuses), and it is recorded.
  assert config['clients_per_round'] == 31
  assert rows['banded_normalize_adaptive']['cohort'] == '31'
  assert rows['tff_tree_adaptive']['cohort'] == '31'
  assert '| 31 |' in (root / 'frontier.md').read_text()


@pytest.mark.parametrize('flag, message', [
    ('--methods=tff_magic', '--methods: unknown'),
    ('--epsilons=2,x', '--epsilons must be numbers'),
    ('--epsilons=0', '--epsilons must be positive'),
    ('--final_seeds=0', '--final_seeds must be positive'),
])
def test_bad_flag_is_one_line_exit_2(tmp_path, flag, message):
  result = as_a_user.run(['-m', 'scripts.benchmark_frontier', flag,
                          f'--root_output_dir={tmp_path}'], timeout=120)
  assert result.returncode == 2
  assert result.stderr.count('\n') == 1 and message in result.stderr, (
      result.stderr)
  assert not os.listdir(tmp_path)
