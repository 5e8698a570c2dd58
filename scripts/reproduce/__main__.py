r"""Reproduce one seed paper's checkable claims.

  .venv/bin/python -m scripts.reproduce --paper=001 [--quick]
  .venv/bin/python -m scripts.reproduce --paper=all [--quick]   # 000 to 004

prints the paper's numbers beside ours, saves plots under
`--output_dir/paper<NNN>/`, writes `report.md` there, and ends with one
verdict per claim (reproduced / partly / not reproduced), each computed from
the criterion printed beside it. `--quick` is a smoke run (under a minute,
tiny models, few rounds, one seed): it states no verdict ('not judged (quick
run)' beside each claim's criterion). docs/REPRODUCTION.md
holds the full runs.
"""

import importlib
import os
import time

from absl import app
from absl import flags
from absl import logging

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# pylint: disable=g-import-not-at-top,unused-import
import tensorflow as tf  # Before main: see scripts/train.py.
from scripts import cli
from scripts.reproduce import common
# pylint: enable=g-import-not-at-top,unused-import

PAPERS = ('000', '001', '002', '003', '004')

FLAGS = flags.FLAGS
flags.DEFINE_enum('paper', None, list(PAPERS) + ['all'],
                  'Which seed paper; `all` runs them one after the other.')
flags.DEFINE_bool('quick', False, 'Smoke run: tiny, under a minute.')
flags.DEFINE_string('output_dir', 'runs/reproduce',
                    'Where runs, plots and report.md go.')


def reproduce(paper: str, quick: bool, output_dir: str):
  """Runs paper `paper`'s module; returns its `common.Report`."""
  if paper not in PAPERS:
    raise ValueError(f'`paper` must be one of {PAPERS}; got {paper!r}.')
  from tff_clip.runtime import execution  # pylint: disable=g-import-not-at-top
  execution.set_local_cpp_context()
  module = importlib.import_module(f'scripts.reproduce.paper{paper}')
  if quick:
    output_dir = os.path.join(output_dir, 'quick')
  report = module.run(quick, output_dir)
  if quick:
    common.as_quick(report)  # States no verdict.
  path = os.path.join(output_dir, f'paper{paper}', 'report.md')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(report.text() + '\n')
  return report


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if FLAGS.paper is None:
    raise app.UsageError(
        f'--paper is required: one of {", ".join(PAPERS)} or all.')
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  for paper in PAPERS if FLAGS.paper == 'all' else [FLAGS.paper]:
    started = time.perf_counter()
    report = reproduce(paper, FLAGS.quick, FLAGS.output_dir)
    print(report.text())
    print(f'\n({time.perf_counter() - started:.0f} s)\n', flush=True)
  return 0


if __name__ == '__main__':
  cli.run(main)
