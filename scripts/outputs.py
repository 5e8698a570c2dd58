"""The files the benchmark scripts write next to their runs: CSV tables and
matplotlib figures (saved headless, closed after saving)."""

import contextlib
import csv

from tff_clip.program import plotting


def write_csv(path, rows) -> None:
  """`rows` (dicts with the same keys, at least one) as a CSV with a header."""
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


@contextlib.contextmanager
def figure(path, *args, **subplots_kwargs):
  """`with figure(path, figsize=...) as (fig, ax):` draws and saves a PNG.

  The arguments are `matplotlib.pyplot.subplots`'s; the figure is laid out,
  saved at 100 dpi and closed when the block ends.
  """
  plt = plotting.pyplot()
  fig, axes = plt.subplots(*args, **subplots_kwargs)
  try:
    yield fig, axes
    fig.tight_layout()
    fig.savefig(path, dpi=100)
  finally:
    plt.close(fig)
