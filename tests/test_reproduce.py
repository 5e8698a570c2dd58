"""Specification of `scripts.reproduce` (one command per seed paper).

Default suite: the verdict rule, the report's format (on a report made
here), and Pelikan et al. 2025's Table 1 epsilons against the published
values. Slow suite: `--paper=all --quick` (every paper's smoke run, one
process) printing each paper's tables and, for each claim, no verdict.
"""

import os
import re

import pytest

from scripts.reproduce import common
from scripts.reproduce import paper002
import as_a_user  # pylint: disable=g-bad-import-order
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
  from tff_clip.privacy import accounting
  z, cohort, population, rounds, paper_epsilon, _ = paper002.TABLE1[row]
  guarantee = accounting.compute_training_epsilon(
      z, cohort, population, rounds, paper002.DELTA, accountant='rdp')
  assert f'{guarantee.epsilon:.2g}' == f'{paper_epsilon:.2g}'


def test_report_text_has_its_tables_then_one_verdict_row_per_claim():
  report = common.Report(paper='00x', title='A title', scale='tiny')
  report.add_table('Accuracy', ['method', 'acc'], [['clip', 0.5],
                                                   ['a | b', 0.25]])
  report.claims = [
      common.Claim('Claim 1', 'x > y', 'x = 2, y = 1', common.REPRODUCED,
                   'x > y'),
      common.Claim('Claim 2 | pipes', 'z', 'z = 0', common.NOT_REPRODUCED,
                   'z > 0')]
  text = report.text()

  assert text.startswith('# Paper 00x: A title\nscale: tiny\n')
  assert text.index('## Accuracy') < text.index('## Verdicts')
  rows = _verdict_rows(text)
  assert [row[0] for row in rows] == ['Claim 1', r'Claim 2 \| pipes']
  assert [row[3] for row in rows] == [common.REPRODUCED,
                                       common.NOT_REPRODUCED]


def test_a_quick_report_states_no_verdict():
  report = common.Report(paper='00x', title='A title', scale='tiny')
  report.claims = [
      common.Claim('Claim 1', 'x > y', 'x = 2, y = 1', common.REPRODUCED,
                   'x > y'),
      common.Claim('Claim 2', 'z', 'z = 0', common.PARTLY, 'z > 0')]
  text = common.as_quick(report).text()
  assert f'scale: {common.QUICK_SCALE}: tiny\n' in text
  rows = _verdict_rows(text)
  assert [row[3] for row in rows] == [common.NOT_JUDGED] * 2
  assert [row[4] for row in rows] == ['x > y', 'z > 0']  # Criteria kept.
  for verdict in VERDICTS:  # No verdict word is left in the table.
    assert not re.search(rf'\| {verdict} \|', text)


@pytest.fixture(scope='module')
def quick_run(tmp_path_factory):
  """`--paper=all --quick`: every paper's smoke run, in one process."""
  output_dir = tmp_path_factory.mktemp('reproduce')
  result = as_a_user.run(['-m', 'scripts.reproduce', '--paper=all', '--quick',
                          f'--output_dir={output_dir}'])
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result.stdout, output_dir / 'quick'


def _verdict_rows(text):
  """The claim rows of the `## Verdicts` table in `text`."""
  table = text.split('## Verdicts', 1)[1].strip().splitlines()
  rows = []
  for line in table[2:]:
    if not line.startswith('|'):
      break
    cells = re.split(r'(?<!\\)\|', line)[1:-1]  # '\|' is a pipe in a cell
    rows.append([c.strip() for c in cells])
  return rows


@pytest.mark.slow
@pytest.mark.parametrize('paper', ['000', '001', '002', '003', '004'])
def test_quick_command_prints_each_papers_tables_and_a_verdict_per_claim(
    quick_run, paper):
  stdout, output_dir = quick_run
  printed = stdout.split(f'# Paper {paper}:', 1)[1].split('\n# Paper ', 1)[0]
  assert common.QUICK_SCALE in printed
  assert printed.count('\n## ') >= 2  # at least one table, then the verdicts
  rows = _verdict_rows(printed)
  assert rows
  for claim, _, measured, verdict, criterion in rows:
    assert claim and measured and criterion
    assert verdict == common.NOT_JUDGED  # One seed of a few rounds: none.
  saved = (output_dir / f'paper{paper}' / 'report.md').read_text()
  assert _verdict_rows(saved) == rows
  for line in printed.splitlines():
    if line.startswith('plot: '):
      assert os.path.isfile(line[len('plot: '):])


@pytest.mark.slow
def test_quick_run_of_paper_001_checks_both_fig4_claims(quick_run):
  stdout, _ = quick_run
  printed = stdout.split('# Paper 001:', 1)[1].split('\n# Paper ', 1)[0]
  assert [row[0] for row in _verdict_rows(printed)] == [
      'Fig. 4: FedAvg does not converge under Cauchy noise; FAT-Clipping does',
      'Fig. 4: PI converges faster than PR']
