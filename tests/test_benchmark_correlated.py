"""Specification of the correlated-noise benchmark (`scripts.benchmark_correlated`)."""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _python(code, cwd):
  # In a fresh interpreter: scripts define flags in absl's global registry.
  return subprocess.run([sys.executable, '-c', code], cwd=cwd,
                        env=dict(os.environ, PYTHONPATH=str(REPO)),
                        capture_output=True, text=True, timeout=120,
                        check=False)


def test_every_variant_calibrates_to_the_target_epsilon_with_its_own_sampling(
    tmp_path):
  result = _python(f'''
from scripts import benchmark_correlated as b
table = b.variants(5)
plan = b.configs('digits', list(table), table, [2.0, 8.0], [0, 1], None,
                 {str(tmp_path)!r})
assert len(plan) == 5 * 2 * 2
for name, epsilon, seed, c in plan:
  assert c.target_epsilon == epsilon and c.noise_multiplier is None
  assert c.rounds == 40
  assert c.sampling == ('poisson' if name == 'independent' else
                        'min_separation'), name
  assert c.bands == (1 if name == 'independent' else 5)
  # A separated variant's cohort is the smallest of the 5 equal groups of
  # the 100 clients, 20, as under independent noise, whatever the seed.
  assert c.clients_per_round == 20, (name, seed)
print(sorted(table))
''', REPO)
  assert result.returncode == 0, result.stderr[-2000:]
  assert ("['banded_5', 'blt_5', 'independent', 'tff_tree_5', 'tree_5']"
          in result.stdout)
  assert not os.listdir(tmp_path)  # Planning writes nothing.


def test_table_has_one_row_per_variant_and_one_column_per_epsilon(tmp_path):
  result = _python('''
from scripts import benchmark_correlated as b
results = [dict(variant='banded_5', epsilon=2.0, seed=0, accuracy=0.5,
                cohort=16),
           dict(variant='banded_5', epsilon=2.0, seed=1, accuracy=0.7,
                cohort=14),
           dict(variant='banded_5', epsilon=8.0, seed=0, accuracy=0.9,
                cohort=16)]
rows = b.summarise(results, ['banded_5', 'independent'], [2.0, 8.0])
print(b.format_table(rows, [2.0, 8.0]))
b.plot(rows, [2.0, 8.0], 'correlated.png', 'title')
''', tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert lines[0] == '| variant | ε = 2 | ε = 8 | cohort |'
  # Sample std of (0.5, 0.7) is 0.1414; a variant without runs is n/a. The
  # cohort column: the clients per round of its runs, over seeds.
  assert lines[2] == ('| banded_5 | 0.6000 ± 0.1414 (2) | '
                      '0.9000 ± 0.0000 (1) | 14-16 |')
  assert lines[3] == '| independent | n/a | n/a | - |'
  assert (tmp_path / 'correlated.png').stat().st_size > 0


def test_bad_epsilons_are_one_line_exit_2():
  result = subprocess.run(
      [sys.executable, '-m', 'scripts.benchmark_correlated',
       '--epsilons=2,x'], cwd=REPO, capture_output=True, text=True,
      timeout=120, check=False)
  assert result.returncode == 2
  assert result.stderr.startswith('error: --epsilons')


@pytest.mark.slow
def test_quick_run_prints_the_table(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'scripts.benchmark_correlated', '--quick',
       '--bands=2', f'--root_output_dir={tmp_path}'], cwd=REPO,
      capture_output=True, text=True, timeout=900, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert '| tff_tree_2 |' in result.stdout
  # The 2 groups hold 50 of the 100 clients each: 20 fit, in each
  # of the 5 variants (independent, banded, tree, BLT, TFF's tree).
  assert result.stdout.count(' | 20 |') == 5, result.stdout
  # One line per training, not the trainings' own per-round lines.
  assert 'round 1/' not in result.stdout
  assert (tmp_path / 'digits' / 'correlated.png').exists()


def test_a_variant_named_with_its_own_b_runs_that_b_whatever_bands_says(
    tmp_path):
  result = _python(f'''
from scripts import benchmark_correlated as b
table = b.variants(2)
named = b.named_variants(['blt_20', 'banded_2', 'tff_tree_7', 'blt_x',
                          'nonsense_3'], table)
assert sorted(named) == ['blt_20', 'tff_tree_7'], named
assert named['blt_20']['bands'] == 20, named
assert named['blt_20']['noise_mechanism'] == 'blt', named
assert named['tff_tree_7']['bands'] == 7, named
table.update(named)
plan = b.configs('digits', ['blt_20'], table, [8.0], [0], None,
                 {str(tmp_path)!r})
(name, _, _, config), = plan
assert name == 'blt_20' and config.separation == 20, config
''', REPO)
  assert result.returncode == 0, result.stderr[-3000:]


def test_correlated_variants_are_paired_by_seed_with_both_baselines(tmp_path):
  # Seeds 0-2: BLT 10, 12, 14 points above independent noise. Student t
  # with 2 degrees of freedom: 12 -+ 4.303 * 2 / sqrt(3) = [7.03, 16.97].
  result = _python('''
from scripts import benchmark_correlated as b
results = []
for seed, gap in enumerate((0.10, 0.12, 0.14)):
  for name, accuracy in (('independent', 0.5), ('blt_5', 0.5 + gap),
                         ('tff_tree_5', 0.4)):
    results.append(dict(variant=name, epsilon=4.0, seed=seed,
                        accuracy=accuracy, fresh=True))
rows = b.paired(results, ['independent', 'blt_5', 'tff_tree_5'], [4.0], 5)
for name, against, epsilon, d in rows:
  print(name, against, round(d.difference, 2), round(d.low, 2),
        round(d.high, 2), d.verdict)
''', tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines() == [
      'blt_5 independent 12.0 7.03 16.97 win',
      'blt_5 tff_tree_5 22.0 17.03 26.97 win',
      'tff_tree_5 independent -10.0 -10.0 -10.0 loss',
  ]
