r"""Ledger epsilon vs empirical audit, for a few noise multipliers (docs/audit.md).

Runs `scripts.train --audit_canaries=K` once per z (each in its own process)
and prints a Markdown table: the ledger's epsilon, and per threat model the
audit's estimate and lower bound.

  .venv/bin/python -m scripts.audit_table --noise_multipliers=0.5,1,2,4 \
      -- --clip_norm=0.2 --rounds=30

Arguments after `--` go to every `scripts.train` run. Finished runs are
reused (their summary.json is read), so an interrupted table resumes.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from scripts import cli

_Z = flags.DEFINE_list('noise_multipliers', ['0.5', '1', '2', '4'],
                       'Noise multipliers z, one run each.')
_CANARIES = flags.DEFINE_integer('audit_canaries', 50, 'Canary clients.')
_ROOT = flags.DEFINE_string('root_output_dir', 'runs/audit_table',
                            'Where the runs go.')
_OUT = flags.DEFINE_string(
    'output', None, 'Also write the table to this file (new, or a table '
    'this script wrote before: any other file is refused, not replaced).')

# The first cells of the table's header: how an --output file is recognised
# as a table this script wrote (and may write again).
_HEADER = '| z | ledger epsilon ('


def _fmt(value):
  return 'inf' if value == float('inf') else f'{value:.3g}'


def _epsilon_by(summary) -> str:
  """'PLD, delta 1e-05': the accountant and delta of a run's epsilon
  (`summary.json`), NOT private where its noise was seeded."""
  return (f"{str(summary.get('accountant', 'rdp')).upper()}, delta "
          f"{summary['delta']:g}" +
          ('' if summary.get('private', True) else ', NOT private'))


def _estimate(row, inserted, candidates, delta):
  # The approximate 95% range from the stored fits (`audit.estimate_range`).
  from tff_clip.privacy import audit  # pylint: disable=g-import-not-at-top
  if row['estimate'] == float('inf'):
    return 'inf'
  low, high = audit.estimate_range(
      row['inserted_mean'], row['inserted_std'], inserted, row['null_mean'],
      row['null_std'], candidates - inserted, delta)
  return f'{_fmt(row["estimate"])} ({_fmt(low)}-{_fmt(high)})'


# What the table sets on each run: a run given its own would not be the
# row it is labelled.
_RESERVED = ('noise_multiplier', 'target_epsilon', 'audit_canaries',
             'root_output_dir', 'experiment_name', 'progress', 'flagfile')


def _runs(passthrough):
  """[(z, its run's name, the `scripts.train` argv)]; `UsageError` for a
  list of z or a flag after -- that the table cannot run as labelled."""
  for arg in passthrough:
    name = arg.lstrip('-').split('=')[0]
    if name in _RESERVED or name[2:] in _RESERVED:  # --noprogress.
      raise app.UsageError(f'--{name} is set by audit_table for each row; '
                           'remove it after --.')
  if not _Z.value:
    raise app.UsageError('--noise_multipliers is empty; list at least one z.')
  runs = []
  for z in _Z.value:
    try:
      value = float(z)
    except ValueError:
      value = math.nan
    if not value > 0 or math.isinf(value) or not z.isascii():
      raise app.UsageError('--noise_multipliers must list positive numbers; '
                           f'got {z!r}.')
    runs.append((z, f'z{z}', [
        f'--noise_multiplier={z}', f'--audit_canaries={_CANARIES.value}',
        f'--root_output_dir={_ROOT.value}', f'--experiment_name=z{z}',
        '--progress=false', *passthrough]))
  return runs


def _check_output(path):
  """`UsageError` unless --output names a new file in an existing
  directory, or a table this script wrote before (a rerun rewrites it):
  nothing else already on disk is replaced."""
  if path is None:
    return
  if os.path.isdir(path) or not os.path.isdir(
      os.path.dirname(os.path.abspath(path))):
    raise app.UsageError(f'--output={path}: not a file in an existing '
                         'directory.')
  if os.path.lexists(path):
    try:
      with open(path) as f:
        ours = f.readline().startswith(_HEADER)
    except (OSError, UnicodeDecodeError):
      ours = False
    if not ours or os.path.islink(path):
      raise app.UsageError(
          f'--output={path} exists and is not a table audit_table wrote; '
          'name a new file.')


def main(argv):
  runs = _runs(argv[1:])
  _check_output(_OUT.value)
  pending = [args for _, name, args in runs if not os.path.exists(
      os.path.join(_ROOT.value, name, 'summary.json'))]
  refused = cli.first_refusal(pending)  # Before any run writes a file.
  if refused is not None:
    raise app.UsageError(f'{pending[refused[0]][0]}: {refused[1]}')
  rows, labels = [], []
  for z, name, args in runs:
    summary_path = os.path.join(_ROOT.value, name, 'summary.json')
    if not os.path.exists(summary_path):
      command = [sys.executable, '-m', 'scripts.train', *args]
      print(' '.join(command), file=sys.stderr, flush=True)
      code = cli.run_child(command, stdout=subprocess.DEVNULL)
      if code != 0:  # scripts.train said why, on stderr.
        cli.fail(f'the run of z={z} failed (exit {code}); rerun to resume it.')
        return 1
    with open(summary_path) as f:
      summary = json.load(f)
    audit = summary['empirical_epsilon']
    counts = (audit['inserted'], audit['candidates'], audit['delta'])
    labels.append(_epsilon_by(summary))
    rows.append((
        f'| {z} | {_fmt(summary["epsilon"])}', f' | '
        f'{_estimate(audit["final_model"], *counts)} | '
        f'{_fmt(audit["final_model"]["lower_bound"])} | '
        f'{_estimate(audit["all_iterates"], *counts)} | '
        f'{_fmt(audit["all_iterates"]["lower_bound"])} | '
        f'{audit["inserted"]} / {audit["candidates"]} | '
        f'{summary["final_eval_accuracy"]:.3f} |'))
  confidence = f'{audit["confidence"]:.0%}'
  # Each run's one epsilon, named by its accountant and delta: in the
  # header where the rows agree, else in each row's cell.
  shared = len(set(labels)) == 1
  rows = [epsilon + ('' if shared else f' ({by})') + rest
          for (epsilon, rest), by in zip(rows, labels)]
  table = '\n'.join([
      f'{_HEADER}{labels[0] if shared else "per row"}) | final model: '
      f'estimate (~95% range) | final model: lower bound ({confidence}) | '
      f'all iterates: estimate (~95% range) | all iterates: lower bound '
      f'({confidence}) | '
      'canaries inserted / candidates | accuracy |',
      '|---:|---:|---:|---:|---:|---:|---:|---:|', *rows])
  print(table)
  if _OUT.value:
    _check_output(_OUT.value)  # Still this script's, after the runs.
    with tempfile.NamedTemporaryFile(
        'w', dir=os.path.dirname(os.path.abspath(_OUT.value)),
        prefix='.audit_table.', delete=False) as f:
      f.write(table + '\n')
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(f.name, 0o666 & ~umask)  # As `open(path, 'w')` would make it.
    os.replace(f.name, _OUT.value)


if __name__ == '__main__':
  cli.run(main, interrupted=cli.RESUMES_ITS_RUNS)
