"""Plots of a run's metrics: accuracy, loss, clip norm and epsilon per round."""

from __future__ import annotations

import csv
import io
import math
import sys
import threading

from tff_clip import names
from tff_clip.program import run_records

__all__ = ['import_in_background', 'plot_metrics', 'pyplot', 'read_metrics']

PANELS = (
    ('eval_accuracy', 'eval accuracy'),
    # A DP run withholds client training loss by default: eval loss then.
    (('train_loss', 'eval_loss'), 'loss'),
    ('clip_norm', 'clip norm'),
    (names.EPSILON, 'epsilon'),
)


def epsilon_axis_label(column: str) -> str:
  """'epsilon (PLD, delta 1e-06)' for a DP run's epsilon column
  (`names.epsilon_key`), NOT private when its noise was seeded."""
  if column == names.EPSILON:
    return 'epsilon'
  rest = column[len(names.EPSILON) + 1:]
  private = not rest.startswith('NOT_PRIVATE_')
  if not private:
    rest = rest[len('NOT_PRIVATE_'):]
  accountant, _, delta = rest.partition('_delta_')
  return (f'epsilon ({accountant.upper()}, delta {delta})' +
          ('' if private else ' NOT private'))


# One thread at a time imports matplotlib, and an import that fails starts
# once more from nothing. A half-done import leaves submodules such as
# `matplotlib._docstring` in `sys.modules` without the package (an import
# that failed, or a caller that restored `sys.modules` around it, as
# `mock.patch.dict(sys.modules)` does); `import matplotlib` then finds them
# there, never binds them to the package, and fails with "module 'matplotlib'
# has no attribute '_docstring'" for every plot the process draws.
_IMPORT_LOCK = threading.Lock()


def _import_pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _forget_matplotlib() -> None:
  for name in list(sys.modules):
    if name.split('.')[0] in ('matplotlib', 'mpl_toolkits'):
      del sys.modules[name]


def pyplot():
  """`matplotlib.pyplot` on the file-only Agg backend, imported once."""
  with _IMPORT_LOCK:
    try:
      return _import_pyplot()
    except Exception:  # pylint: disable=broad-except
      _forget_matplotlib()
    try:
      return _import_pyplot()
    except BaseException:
      _forget_matplotlib()
      raise


def import_in_background() -> None:
  """Starts importing matplotlib on a thread; `plot_metrics` waits for it.

  The import is most of a plot's cost (about 0.6 s against 0.3 s to draw):
  started while a run trains, it no longer holds up the run's result.
  A `pyplot()` called before it finished waits for it; an import that
  failed here starts afresh there, and is reported there if it fails again.
  """
  def run():
    try:
      pyplot()
    except Exception:  # pylint: disable=broad-except
      pass
  threading.Thread(target=run, name='import matplotlib', daemon=True).start()


def read_metrics(csv_path: str) -> dict[str, list[float]]:
  """Columns of a metrics CSV as floats (empty cells are NaN); read with
  `run_records.open_file` (never through a link)."""
  with run_records.open_file(csv_path, 'r', newline='') as f:
    rows = list(csv.DictReader(f))
  columns = {}
  for row in rows:
    for key, value in row.items():
      try:
        number = float(value) if value not in ('', None) else math.nan
      except ValueError:
        number = math.nan
      columns.setdefault(key, []).append(number)
  return columns


def plot_metrics(csv_path: str, png_path: str, title: str = '') -> str:
  """Writes a 2x2 PNG of the `PANELS` against round; returns its path.

  Raises `run_records.RunRecordError` (one line) when it cannot be written.
  """
  plt = pyplot()
  columns = read_metrics(csv_path)
  rounds = columns.get('round', [])
  fig, axes = plt.subplots(2, 2, figsize=(10, 7))
  for ax, (keys, label) in zip(axes.flat, PANELS):
    keys = (keys,) if isinstance(keys, str) else keys
    key = next((k for k in keys if k in columns), keys[0])
    series = (key,)
    if keys == (names.EPSILON,):
      # Each accountant's column, named by it and its delta: a run whose
      # accountant changed (PLD's figure void) has one of each.
      series = tuple(k for k in columns if names.is_epsilon_key(k)) or keys
      label = (epsilon_axis_label(series[0]) if len(series) == 1
               else 'epsilon')
    elif len(keys) > 1:
      label = key.replace('_', ' ')
    drawn = 0
    for column in series:
      points = [(r, v) for r, v in zip(rounds, columns.get(column, []))
                if math.isfinite(v)]
      if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker='o' if len(xs) < 30 else None, markersize=3,
                label=epsilon_axis_label(column) if drawn or series[1:]
                else None)
        drawn += 1
    if drawn > 1:
      ax.legend(fontsize='small')
    if not drawn:
      ax.text(0.5, 0.5, 'not recorded' if key != names.EPSILON else
              'no DP: epsilon = inf', ha='center', va='center',
              transform=ax.transAxes)
    ax.set_xlabel('round')
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
  fig.suptitle(title)
  fig.tight_layout()
  # Drawn in memory, then written whole or not at all (a full disk leaves
  # no truncated plot.png, and `run_records.RunRecordError` says so).
  image = io.BytesIO()
  fig.savefig(image, format='png', dpi=100)
  plt.close(fig)
  run_records.atomic_write(png_path, image.getvalue())
  return png_path
