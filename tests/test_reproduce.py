"""Specification of `scripts.reproduce` (one command per seed paper).

Default suite: the verdict rule, seed 002's Table 1 epsilons against the
published values, and seed 001's quick run end to end in-process. Every
paper's `--quick` command line runs in the slow suite (each is about a
minute on an idle 2-core machine; together they exceed the default suite's
budget).
"""

import os
import pathlib
import subprocess
import sys

import pytest

from scripts.reproduce import common
from scripts.reproduce import paper002

REPO = pathlib.Path(__file__).resolve().parents[1]
VERDICTS = (common.REPRODUCED, common.PARTLY, common.NOT_REPRODUCED)


@pytest.mark.parametrize('passed,verdict', [
    ([True, True], common.REPRODUCED),
    ([True, False], common.PARTLY),
    ([False, False], common.NOT_REPRODUCED),
    ([], common.NOT_REPRODUCED),
])
def test_verdict_is_all_some_or_none_of_the_checks(passed, verdict):
  assert common.verdict_from(passed) == verdict


@pytest.mark.parametrize('row', [2, 13])  # epsilon 6.5 and 7.2 (the headline)
def test_table1_epsilon_matches_the_paper_to_two_digits(row):
  from tff_clip import accounting
  z, cohort, population, rounds, paper_epsilon, _ = paper002.TABLE1[row]
  guarantee = accounting.compute_training_epsilon(
      z, cohort, population, rounds, paper002.DELTA, accountant='rdp')
  assert f'{guarantee.epsilon:.2g}' == f'{paper_epsilon:.2g}'


def test_quick_reproduction_of_paper_001_reports_every_claim(tmp_path):
  from scripts.reproduce import __main__ as cli
  report = cli.reproduce('001', quick=True, output_dir=str(tmp_path))
  assert [c.name for c in report.claims] == [
      'Fig. 4: FedAvg does not converge under Cauchy noise; FAT-Clipping does',
      'Fig. 4: PI converges faster than PR']
  assert all(c.verdict in VERDICTS and c.criterion for c in report.claims)
  assert os.path.isfile(report.plots[0])
  text = (tmp_path / 'quick' / 'paper001' / 'report.md').read_text()
  assert 'QUICK smoke run (not evidence)' in text and '## Verdicts' in text


@pytest.mark.slow
@pytest.mark.parametrize('paper', ['000', '001', '002', '003', '004'])
def test_quick_command_prints_the_tables_and_verdicts(tmp_path, paper):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  env.pop('TF2_BEHAVIOR', None)
  result = subprocess.run(
      [sys.executable, '-m', 'scripts.reproduce', f'--paper={paper}',
       '--quick', f'--output_dir={tmp_path}'],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert f'# Paper {paper}' in result.stdout
  assert '## Verdicts' in result.stdout
  assert any(v in result.stdout for v in VERDICTS)
