"""Specification of the utility benchmark (`scripts.benchmark_utility`)."""

import csv
import os

import pytest

from scripts import program
from tff_clip.program import config as config_lib
import as_a_user  # pylint: disable=g-bad-import-order

QUICK_VARIANTS = ('tff_adaptive', 'per_layer_clip_adaptive')


def test_every_variant_is_a_valid_configuration_at_equal_z(tmp_path):
  # In a fresh interpreter: scripts define flags in absl's global registry.
  check = f'''
from scripts import benchmark_utility as b
plan = b.configs('digits', list(b.VARIANTS), [0, 1], None, 1.0, 0.5,
                 {str(tmp_path)!r}, {{}})
assert len(plan) == 2 * len(b.VARIANTS)
private = [c for _, _, c in plan if c.private]
assert {{c.noise_multiplier for c in private}} == {{1.0}}
assert {{(c.rounds, c.clients_per_round, c.seed) for c in private}} == {{
    (40, 20, 0), (40, 20, 1)}}
assert tuple(b.QUICK_VARIANTS) == {QUICK_VARIANTS!r}
'''
  result = as_a_user.python(check, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert not os.listdir(tmp_path)  # Planning writes nothing.


def test_table_is_mean_and_std_over_seeds_at_one_epsilon(tmp_path):
  check = f'''
from scripts import benchmark_utility as b
results = [
    dict(variant='clip', accuracy=0.5, epsilon=2.0, seconds=10.0),
    dict(variant='clip', accuracy=0.7, epsilon=2.0, seconds=20.0),
    dict(variant='no_dp', accuracy=0.9, epsilon=None, seconds=5.0)]
rows = b.summarise(results, ['clip', 'no_dp'])
print(b.format_table(rows))
b.plot(rows, {str(tmp_path / 'utility.png')!r}, 'title')
'''
  result = as_a_user.python(check, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  # Sample std of (0.5, 0.7) is 0.1414; a run without DP has no epsilon.
  assert '| clip | 2 | 0.6000 ± 0.1414 | 2 | 15.0 |' in result.stdout
  assert '| no_dp | 1 | 0.9000 ± 0.0000 | none (no DP) | 5.0 |' in (
      result.stdout)
  assert (tmp_path / 'utility.png').stat().st_size > 0


@pytest.mark.slow
def test_quick_run_prints_the_table_at_one_epsilon(tmp_path):
  result = as_a_user.run(['-m', 'scripts.benchmark_utility', '--quick',
                          f'--root_output_dir={tmp_path}'])
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / 'digits' / 'utility.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [r['variant'] for r in rows] == list(QUICK_VARIANTS)
  # TFF's adaptive aggregator and tff_clip's: the same ledger epsilon.
  assert float(rows[0]['epsilon']) == pytest.approx(float(rows[1]['epsilon']),
                                                    rel=1e-6)
  assert (tmp_path / 'digits' / 'utility.png').exists()
  assert '| per_layer_clip_adaptive | 1 |' in result.stdout


def test_bad_variant_is_one_line_exit_2():
  result = as_a_user.run(['-m', 'scripts.benchmark_utility',
                          '--variants=magic'], timeout=120)
  assert result.returncode == 2
  assert result.stderr.startswith('error: --variants')


def test_tff_baseline_needs_noise():
  config = config_lib.TrainConfig(bounding='tff_gaussian',
                                  noise_multiplier=None)
  with pytest.raises(config_lib.ConfigError, match='tff_gaussian'):
    program.validate(config)
