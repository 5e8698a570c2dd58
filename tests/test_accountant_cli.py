"""Specification of the privacy CLI (`python -m scripts.accountant`)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# The README example: 5000 rounds of z = 1, 100 of 10,000 clients.
EXAMPLE = ['--noise_multiplier=1.0', '--clients_per_round=100',
           '--population_size=10000', '--rounds=5000', '--delta=1e-6']


def _run(*flags):
  return subprocess.run(
      [sys.executable, '-m', 'scripts.accountant', *flags],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
      env={**os.environ, 'PYTHONPATH': str(REPO_ROOT)}, check=False)


@pytest.fixture(scope='module')
def example_with_extrapolation():
  return _run(*EXAMPLE, '--extrapolate')


def test_cli_prints_epsilon_of_both_accountants(example_with_extrapolation):
  result = example_with_extrapolation

  assert result.returncode == 0, result.stderr
  assert 'RDP epsilon = 5.1132' in result.stdout
  assert 'optimal RDP order 5.6' in result.stdout
  assert 'PLD epsilon = 4.73' in result.stdout


def test_cli_extrapolate_prints_the_population_table(
    example_with_extrapolation):
  lines = example_with_extrapolation.stdout.splitlines()
  header = next(i for i, line in enumerate(lines) if 'K (population)' in line)

  assert re.split(r'\s{2,}', lines[header].strip()) == [
      'n (clients/round)', 'K (population)', 'q', 'z', 'RDP epsilon',
      'RDP order', 'PLD epsilon']
  assert len(lines) - header - 1 == 5  # One row per default scale pair.
  assert lines[header + 1].split()[:4] == ['100', '10,000', '0.01', '1']
  assert lines[header + 3].split()[:2] == ['10,000', '1,000,000']


def test_cli_target_epsilon_calibrates_the_noise_multiplier():
  result = _run('--target_epsilon=5.1132', '--clients_per_round=100',
                '--population_size=10000', '--rounds=5000', '--delta=1e-6',
                '--accountants=rdp')

  assert result.returncode == 0, result.stderr
  assert 'noise_multiplier = 1.000' in result.stdout


def test_cli_fixed_size_sampling_reports_pld_as_unavailable():
  result = _run('--noise_multiplier=1.0', '--clients_per_round=100',
                '--population_size=10000', '--rounds=100', '--delta=1e-6',
                '--sampling=fixed_size')

  assert result.returncode == 0, result.stderr
  assert 'replace-one' in result.stdout
  assert 'RDP epsilon = ' in result.stdout
  assert 'PLD epsilon = n/a' in result.stdout


def test_cli_bad_input_fails_naming_the_argument():
  result = _run(*EXAMPLE[:-1], '--delta=1.5')

  assert result.returncode != 0
  assert '`delta` must be in (0, 1); got 1.5' in result.stderr
  assert result.stdout == ''


@pytest.mark.parametrize('args, name', [
    ([*EXAMPLE[:-1], '--delta=1.5'], 'delta'),
    ([*EXAMPLE, '--accountant=rdp'], 'accountant'),
    ([*EXAMPLE, '--rounds=many'], 'rounds'),
])
def test_cli_bad_flag_is_one_line_with_exit_code_2(args, name):
  result = _run(*args)
  assert result.returncode == 2
  assert result.stderr.startswith('error: ') and name in result.stderr
  assert result.stderr.count('\n') == 1, result.stderr
  assert result.stdout == ''
