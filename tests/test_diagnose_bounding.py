"""Specification of the bounding diagnosis (`scripts.diagnose_bounding`)."""

import json
import math
import subprocess
import sys

import as_a_user  # pylint: disable=g-bad-import-order
import pytest

MODULE = 'scripts.diagnose_bounding'

# Three clients' updates in 2 scalars, norms 5, 1 and 2; tracked norm C = 2;
# noise std 0.5 per coordinate of the sum, which is divided by n = 4.
_ROWS = f'''
import json
import {MODULE} as d
updates = [[3.0, 4.0], [0.0, 1.0], [2.0, 0.0]]
print(json.dumps({{b: d.round_row(updates, 2.0, b, 0.5, 4)
                  for b in ('normalize', 'clip')}}))
'''
# Closed forms, by hand. The raw sum is (5, 5). Normalizing scales the
# updates by C / norm = 0.4, 2, 1: sum (1.2, 1.6) + (0, 2) + (2, 0) =
# (3.2, 3.6); clipping by min(1, C / norm) = 0.4, 1, 1: sum (3.2, 2.6).
# The noise on the mean has norm 0.5 sqrt(2) / 4.
_NOISE = 0.5 * math.sqrt(2) / 4
_RAW = math.sqrt(50)


@pytest.fixture(scope='module')
def rows():
  result = as_a_user.python(_ROWS, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  return json.loads(result.stdout)


def test_norm_quartiles_and_tracked_norm_against_the_median(rows):
  row = rows['normalize']
  assert (row['norm_q25'], row['norm_median'], row['norm_q75']) == (
      1.5, 2.0, 3.5)
  assert row['norm_to_median'] == 1.0


def test_normalization_scales_small_updates_up_and_large_ones_down(rows):
  # The update of norm exactly C is neither.
  assert rows['normalize']['scaled_up'] == pytest.approx(1 / 3)
  assert rows['normalize']['scaled_down'] == pytest.approx(1 / 3)


def test_clipping_never_scales_up(rows):
  assert rows['clip']['scaled_up'] == 0.0
  assert rows['clip']['scaled_down'] == pytest.approx(1 / 3)


def test_signal_is_the_bounded_mean_and_noise_its_gaussian_norm(rows):
  normalized = math.sqrt(3.2**2 + 3.6**2)
  clipped = math.sqrt(3.2**2 + 2.6**2)
  for bounding, bounded in (('normalize', normalized), ('clip', clipped)):
    row = rows[bounding]
    assert row['signal'] == pytest.approx(bounded / 4)
    assert row['noise'] == pytest.approx(_NOISE)
    assert row['noise_to_signal'] == pytest.approx(_NOISE / (bounded / 4))
    assert row['noise_share'] == pytest.approx(
        _NOISE / (bounded / 4 + _NOISE))


def test_cosine_measures_how_far_bounding_turns_the_mean(rows):
  assert rows['normalize']['cosine'] == pytest.approx(
      (5 * 3.2 + 5 * 3.6) / (_RAW * math.sqrt(3.2**2 + 3.6**2)))
  assert rows['clip']['cosine'] == pytest.approx(
      (5 * 3.2 + 5 * 2.6) / (_RAW * math.sqrt(3.2**2 + 2.6**2)))


def test_refuses_both_epsilon_and_noise_multiplier(tmp_path):
  out = tmp_path / 'out'
  line = as_a_user.refusal(as_a_user.run(
      ['-m', MODULE, '--target_epsilon=2', '--noise_multiplier=1',
       f'--output_dir={out}'], timeout=120), out)
  assert '--target_epsilon or --noise_multiplier' in line


@pytest.mark.slow
def test_two_rounds_of_both_defaults_write_the_table_csv_and_plot(tmp_path):
  result = as_a_user.run(
      ['-m', MODULE, '--setting=digits1000', '--noise_multiplier=1',
       '--rounds=2', f'--output_dir={tmp_path}'], timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'NOT differentially private' in result.stdout
  assert '| default | early 1-1 |' in result.stdout
  assert '| tff_default | middle 2-2 |' in result.stdout  # 2 rounds: no late.
  csv_lines = (tmp_path / 'bounding.csv').read_text().splitlines()
  assert len(csv_lines) == 1 + 2 * 2  # Header, 2 configs x 2 rounds.
  assert (tmp_path / 'bounding.png').stat().st_size > 0


@pytest.mark.slow
def test_ends_when_started_ignoring_ctrl_c_as_nohup_does(tmp_path):
  # nohup and background jobs start a program with SIGINT ignored, which its
  # children inherit; TFF's own local worker is stopped with SIGINT and
  # waited for at exit, so a probe on that worker never ended (the process
  # waited on it forever). The probe runs on tff_clip's worker, stopped with
  # the process however it was started.
  result = subprocess.run(
      ['sh', '-c', 'trap "" INT; exec "$@"', 'sh', sys.executable, '-m',
       MODULE, '--setting=digits1000', '--noise_multiplier=1', '--rounds=1',
       f'--output_dir={tmp_path}'],
      cwd=as_a_user.REPO, env=as_a_user.env(), capture_output=True, text=True,
      timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (tmp_path / 'bounding.csv').exists()
