r"""Copies a run's released outputs, and nothing secret, to a new directory.

A run directory holds two kinds of files. What its rounds released
(`config.json`, `releases.jsonl`, `metrics.csv`, `tensorboard/`,
`ledger.json`, `summary.json`, `plot.png`) may be shared: under DP that is
what epsilon covers. `checkpoints/` must never be shared: a DP run's
checkpoints hold the noise key, from which every round's noise can be
regenerated and subtracted from the released model (docs/privacy.md).
This command copies the first kind only, regular files alone (never through
a symbolic link; of a noised run's `tensorboard/`, only event files stamped
with their rounds, never a clock; what it leaves out it names), into a
directory that must not exist yet, and refuses a run a process is training:

  python -m scripts.share_run --run_dir=runs/digits_demo \
      --output_dir=runs/digits_demo_shared

It imports no TensorFlow and answers in about a second.
"""

from __future__ import annotations

from absl import flags

from scripts import cli
from tff_clip.program import checkpoints
from tff_clip.program import run_records

_RUN_DIR = flags.DEFINE_string('run_dir', None, 'The run directory to share.')
_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None, 'Where the released outputs go (must not exist).')


def main(argv) -> int:
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {" ".join(argv[1:])}')
  if not _RUN_DIR.value:
    return cli.fail('--run_dir is required: the run directory to share.')
  if not _OUTPUT_DIR.value:
    return cli.fail('--output_dir is required: a new directory for the '
                    'released outputs.')
  try:
    copied, skipped = checkpoints.share(_RUN_DIR.value, _OUTPUT_DIR.value)
  except run_records.RunRecordError as e:
    return cli.fail(e)
  print(f'{_OUTPUT_DIR.value}/: {", ".join(copied)} (the released outputs; '
        'checkpoints/, which hold the noise key, stay in '
        f'{_RUN_DIR.value}/).')
  if skipped:
    print(f'Not copied (only regular files are, never through a link): '
          f'{", ".join(skipped)}.')
  return 0


if __name__ == '__main__':
  cli.run(main)
