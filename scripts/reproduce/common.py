"""Shared pieces of the reproductions: claims, verdicts, tables, loops."""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import zlib
from typing import Any, Callable, Optional, Sequence

import numpy as np

from tff_clip.program import plotting

REPRODUCED = 'reproduced'
PARTLY = 'partly'
NOT_REPRODUCED = 'not reproduced'
# A quick run's verdict: a smoke run of tiny models, a few rounds, one seed
# judges nothing (its criterion is still printed, its verdict is not).
NOT_JUDGED = 'not judged (quick run)'
QUICK_SCALE = 'QUICK smoke run (not evidence)'


@dataclasses.dataclass
class Claim:
  """One checkable claim: what the paper says, what we measured, the verdict.

  `criterion` is the rule, in words, that `verdict` was computed from.
  """
  name: str
  paper: str
  measured: str
  verdict: str
  criterion: str


@dataclasses.dataclass
class Report:
  paper: str
  title: str
  scale: str
  tables: list = dataclasses.field(default_factory=list)  # (title, text)
  claims: list = dataclasses.field(default_factory=list)
  plots: list = dataclasses.field(default_factory=list)

  def add_table(self, title: str, headers: Sequence[str], rows) -> str:
    text = format_table(headers, rows)
    self.tables.append((title, text))
    return text

  def text(self) -> str:
    lines = [f'# Paper {self.paper}: {self.title}', f'scale: {self.scale}', '']
    for title, table in self.tables:
      lines += [f'## {title}', table, '']
    for path in self.plots:
      lines.append(f'plot: {path}')
    lines += ['', '## Verdicts']
    lines.append(format_table(
        ['claim', 'paper', 'measured', 'verdict', 'criterion'],
        [[c.name, c.paper, c.measured, c.verdict, c.criterion]
         for c in self.claims]))
    return '\n'.join(lines)


def as_quick(report: Report) -> Report:
  """`report` as a quick run states it: its scale says so, and no claim
  has a verdict (`NOT_JUDGED`)."""
  report.scale = f'{QUICK_SCALE}: {report.scale}'
  for claim in report.claims:
    claim.verdict = NOT_JUDGED
  return report


def verdict_from(passed: Sequence[bool]) -> str:
  """All sub-checks pass: reproduced; some: partly; none: not reproduced."""
  passed = list(passed)
  if passed and all(passed):
    return REPRODUCED
  if any(passed):
    return PARTLY
  return NOT_REPRODUCED


def fmt(value, digits: int = 4) -> str:
  if isinstance(value, str):
    return value
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return 'nan'
  if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
    return f'{value:,}'
  return f'{value:.{digits}g}'


def format_table(headers: Sequence[str], rows) -> str:
  """A markdown table (also readable as plain text)."""
  # Pipes inside cells (|x|, ||u||) are escaped so the markdown table holds.
  cells = [[fmt(c).replace('|', '\\|') for c in row] for row in rows]
  headers = [h.replace('|', '\\|') for h in headers]
  widths = [max([len(h)] + [len(r[i]) for r in cells])
            for i, h in enumerate(headers)]
  line = lambda items: '| ' + ' | '.join(
      str(x).ljust(w) for x, w in zip(items, widths)) + ' |'
  out = [line(headers), '|' + '|'.join('-' * (w + 2) for w in widths) + '|']
  out += [line(r) for r in cells]
  return '\n'.join(out)


def mean_std(values) -> str:
  values = np.asarray(values, dtype=np.float64)
  if values.size == 1:
    return f'{values[0]:.4g}'
  return f'{values.mean():.4g} ± {values.std(ddof=1):.2g}'


# ----------------------------------------------------------------------------
# A light federated loop for the synthetic problems (no DP ledger needed):
# the same client data the training program uses (fresh draws through
# `task.round_train_data`, else the task's ClientData and preprocessing).


def client_datasets(task, client_ids, seed: int, round_num: int,
                    local_steps: Optional[int] = None):
  out = []
  for cid in client_ids:
    round_seed = int(np.random.default_rng(
        [seed, round_num, zlib.crc32(str(cid).encode())]).integers(2**31))
    if task.round_train_data is not None:
      dataset = task.round_train_data(cid, round_seed)
    else:
      dataset = task.datasets.train_data.create_tf_dataset_for_client(cid)
    dataset = task.datasets.train_preprocess_fn(dataset)
    if local_steps is not None:
      dataset = dataset.repeat().take(local_steps)
    out.append(dataset)
  return out


def run_rounds(process, task, rounds: int, seed: int,
               initial_weights=None,
               on_round: Optional[Callable[[int, Any, Any], None]] = None,
               local_steps: Optional[int] = None):
  """Trains all of `task`'s clients every round; returns the final state.

  `on_round(round_num, state, output)` is called after every round.
  """
  state = process.initialize()
  if initial_weights is not None:
    state = process.set_model_weights(state, initial_weights)
  client_ids = list(task.datasets.train_data.client_ids)
  for round_num in range(1, rounds + 1):
    output = process.next(state, client_datasets(task, client_ids, seed,
                                                 round_num, local_steps))
    state = output.state
    if on_round is not None:
      on_round(round_num, state, output)
  return state


def client_updates(task, weights, client_optimizer, seed: int, round_num: int,
                   local_steps: Optional[int] = None):
  """Every client's update w - w_i from `weights`, via TFF's own client work.

  `tff.learning.templates.build_model_delta_client_work` returns the
  CLIENTS-placed results as one Python value per client, so per-client
  quantities (norms, clipping factors) can be measured without
  re-implementing local training.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  client_work = tff.learning.templates.build_model_delta_client_work(
      task.model_fn, client_optimizer,
      client_weighting=tff.learning.ClientWeighting.UNIFORM)
  ids = list(task.datasets.train_data.client_ids)
  data = client_datasets(task, ids, seed, round_num, local_steps)
  output = client_work.next(client_work.initialize(), [weights] * len(ids),
                            data)
  return [[np.asarray(u) for u in r.update] for r in output.result]


def weights_vector(process, state) -> np.ndarray:
  weights = process.get_model_weights(state).trainable
  return np.concatenate([np.asarray(w, np.float64).reshape(-1)
                         for w in weights])


def train(output_dir: str, name: str, **config_fields) -> dict:
  """`tff_clip.program.training.run` with `config_fields`; summary plus metric columns.

  A finished run in `output_dir/name` is resumed (i.e. read back) rather
  than trained again, so an interrupted reproduction picks up where it was.
  """
  from scripts import program  # pylint: disable=g-import-not-at-top
  from tff_clip.program import assembly  # pylint: disable=g-import-not-at-top
  from tff_clip.program import config as config_lib  # pylint: disable=g-import-not-at-top
  from tff_clip.program import run_directory  # pylint: disable=g-import-not-at-top
  from tff_clip.program import plotting  # pylint: disable=g-import-not-at-top
  from tff_clip.program import training  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  config = training.TrainConfig(
      root_output_dir=output_dir, experiment_name=name, progress=False,
      **config_fields)
  summary_path = os.path.join(config.output_dir, 'summary.json')
  config_path = os.path.join(config.output_dir, 'config.json')
  done = False
  if os.path.exists(summary_path) and os.path.exists(config_path):
    with open(config_path) as f:
      stored = {k: v for k, v in json.load(f).items()
                if k not in config_lib.EXECUTION_KEYS +
                run_directory.RECORD_KEYS}
    done = stored == config.identity()
  if done:
    with open(summary_path) as f:
      summary = json.load(f)
  else:
    # `training.run` starts a new local C++ context (a new worker_binary,
    # ~2-3 GB for the CNN) on every call, and the previous worker lives until
    # this process exits; `scripts.reproduce` set the context once already.
    from unittest import mock  # pylint: disable=g-import-not-at-top
    with mock.patch.object(assembly, 'set_execution_context',
                           lambda config: None):
      summary = dict(program.run(config))
  summary['metrics'] = plotting.read_metrics(
      os.path.join(config.output_dir, 'metrics.csv'))
  return summary


def save_figure(fig, output_dir: str, name: str) -> str:
  os.makedirs(output_dir, exist_ok=True)
  path = os.path.join(output_dir, name)
  fig.savefig(path, dpi=110, bbox_inches='tight')
  return path


pyplot = plotting.pyplot
