r"""Per-layer against global bounding: each layer's budget, update norm and noise.

  .venv/bin/python -m scripts.diagnose_per_layer                  # MNIST-28 CNN, z = 0.3
  .venv/bin/python -m scripts.diagnose_per_layer --setting=digits --rounds=2

Trains a setting of `scripts.benchmark_settings` with the same seed under
each `--boundings` (default: global adaptive clipping and per-layer adaptive
clipping, both at the setting's z and `--target_quantile`). Before every DP
round a non-private probe -- the same model weights, the same cohort, no
bounding -- reports each layer's mean client update norm m_h. With the DP
round's budgets (per-layer: C_h; global: one C) and its noise, std
sigma = z C / n per coordinate (n the expected cohort), each layer h of
d_h scalars gets, per round:

  * the signal it can carry, s_h: per-layer min(C_h, m_h); global
    m_h min(1, C / m), m the mean total norm (clipping scales every layer
    of an update alike);
  * the noise on it, sigma sqrt(d_h);
  * their ratio, noise / signal.

Its output is NOT differentially private: the probe reads the clients' raw
update norms, which no DP run releases. A diagnostic for data you may
inspect.

Prints a table per bounding (each layer's ratio, averaged over rounds, and
the final accuracy) and writes `layers.csv` (every round and layer) and
`layers.png` under `--output_dir`.
"""

import collections
import dataclasses
import math
import os

from absl import flags
import numpy as np

from scripts import benchmark_settings
from scripts import cli
from scripts import outputs
from scripts import probes
from scripts import program
from tff_clip.aggregation import mechanisms
from tff_clip.program import config as config_lib

_SETTING = flags.DEFINE_enum('setting', 'mnist28', ['digits', 'mnist28'],
                             'A setting of scripts.benchmark_settings.')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'Rounds (setting default).')
_Z = flags.DEFINE_float('noise_multiplier', None, 'z (setting default).')
_QUANTILE = flags.DEFINE_float('target_quantile', 0.3,
                               'Target quantile of the adaptive norms.')
_BOUNDINGS = flags.DEFINE_list('boundings', ['clip', 'per_layer_clip'],
                               'Boundings compared (adaptive norms).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of both runs.')
_OUTPUT = flags.DEFINE_string('output_dir', 'runs/diagnose_per_layer',
                              'Where layers.csv and layers.png go.')


def layer_rows(bounding, round_num, sizes, mean_layer_norms, budgets, stddev):
  """One row per layer: what it can carry against the noise it gets.

  `budgets` is the per-layer budgets C_h for per-layer bounding, or the one
  norm C (a scalar) for global bounding, whose share of layer h is then
  m_h C / m.
  """
  mean_layer_norms = np.asarray(mean_layer_norms, np.float64)
  total = math.sqrt(float(np.sum(mean_layer_norms**2)))
  budgets = np.asarray(budgets, np.float64)
  if budgets.ndim == 0:  # Global: every layer scaled by min(1, C / m).
    budgets = mean_layer_norms * float(budgets) / max(total, 1e-30)
    signal = np.minimum(budgets, mean_layer_norms)
  else:
    signal = np.minimum(budgets, mean_layer_norms)
  rows = []
  for h, d in enumerate(sizes):
    noise = stddev * math.sqrt(d)
    rows.append(collections.OrderedDict(
        bounding=bounding, round=round_num, layer=h, size=d,
        mean_norm=mean_layer_norms[h], budget=budgets[h], signal=signal[h],
        noise=noise, noise_to_signal=noise / max(signal[h], 1e-30)))
  return rows


def diagnose(base, bounding):
  """(rows, final accuracy) of one DP run of `base` under `bounding`."""
  from tff_clip.program import assembly  # pylint: disable=g-import-not-at-top
  config = dataclasses.replace(base, bounding=bounding, clip_norm='adaptive')
  probe_config = dataclasses.replace(
      base, bounding='per_layer_clip', clip_norm=1e9, noise_multiplier=None,
      target_quantile=None)  # A fixed norm: no quantile to track.
  program.validate(config)
  program.validate(probe_config)
  session = assembly.Session(config, program.build_task)
  probe = assembly.Session(probe_config, program.build_task)
  sizes = [int(np.prod(v.shape)) for v in session.initial_weights.trainable]
  state, probe_state = session.initial_state(), probe.initial_state()
  rows = []
  for round_num in range(1, config.rounds + 1):
    cohort = session.sampler.sample(round_num)
    assert cohort == probe.sampler.sample(round_num)
    weights = session.process.get_model_weights(state)
    probe_output = probe.process.next(
        probe.process.set_model_weights(probe_state, weights),
        probe.client_datasets.datasets(cohort, round_num))
    metrics = session.process.next(
        state, session.client_datasets.datasets(cohort, round_num))
    state = metrics.state
    query_metrics = probes.find(metrics.metrics, 'dp_query_metrics')
    budgets = probes.find(query_metrics, 'layer_budgets')
    if budgets is None:
      budgets = probes.find(query_metrics, 'clip_norm')
    rows += layer_rows(bounding, round_num, sizes,
                       probes.find(probe_output.metrics, 'mean_layer_norms'),
                       budgets,
                       float(probes.find(query_metrics, 'noise_stddev')) /
                       config.clients_per_round)
  accuracy = session.evaluate(state)['eval_accuracy']
  return rows, accuracy


def summary_table(rows, accuracies):
  boundings = list(accuracies)
  layers = sorted({(r['layer'], r['size']) for r in rows})
  head = ('| layer | scalars | ' + ' | '.join(
      f'{b}: budget / norm | {b}: noise / signal' for b in boundings) + ' |')
  lines = [head, '|---:|---:|' + '---:|---:|' * len(boundings)]
  for layer, size in layers:
    cells = []
    for b in boundings:
      mine = [r for r in rows if r['bounding'] == b and r['layer'] == layer]
      cells.append(f'{np.mean([r["budget"] / r["mean_norm"] for r in mine]):.2f}')
      cells.append(f'{np.mean([r["noise_to_signal"] for r in mine]):.1f}')
    lines.append(f'| {layer} | {size:,} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n\nfinal accuracy: ' + ', '.join(
      f'{b} {accuracies[b]:.4f}' for b in boundings)


def plot(rows, path, title):
  boundings = list(dict.fromkeys(r['bounding'] for r in rows))
  with outputs.figure(path, 1, len(boundings),
                      figsize=(6 * len(boundings), 4), sharey=True,
                      squeeze=False) as (fig, axes):
    for ax, bounding in zip(axes[0], boundings):
      mine = [r for r in rows if r['bounding'] == bounding]
      for layer in sorted({r['layer'] for r in mine}):
        points = [(r['round'], r['noise_to_signal']) for r in mine
                  if r['layer'] == layer]
        ax.plot(*zip(*points), label=f'layer {layer} '
                f'({mine[layer]["size"]:,})')
      ax.set_yscale('log')
      ax.set_xlabel('round')
      ax.set_title(bounding)
      ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel('noise / signal per layer')
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)


def main(argv):
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {argv[1:]}')
  unknown = [b for b in _BOUNDINGS.value if b not in mechanisms.BOUNDINGS]
  if unknown or not _BOUNDINGS.value:
    return cli.fail(f'--boundings: unknown {unknown}; choose from '
                    f'{", ".join(mechanisms.BOUNDINGS)}.')
  fields = dict(benchmark_settings.SETTINGS[_SETTING.value],
                partition_alpha=0.5, target_quantile=_QUANTILE.value,
                seed=_SEED.value, progress=False)
  if _Z.value is not None:
    fields['noise_multiplier'] = _Z.value
  try:
    base, rows, accuracies = probes.compare(fields, _ROUNDS.value, _BOUNDINGS.value,
                                            diagnose, _OUTPUT.value)
  except config_lib.ConfigError as e:
    return cli.fail(e)
  outputs.write_csv(os.path.join(_OUTPUT.value, 'layers.csv'), rows)
  plot(rows, os.path.join(_OUTPUT.value, 'layers.png'),
       f'{_SETTING.value}: z = {base.noise_multiplier}, target quantile '
       f'{base.target_quantile}, {base.rounds} rounds, seed {base.seed}')
  print(summary_table(rows, accuracies))
  print(f'outputs: {_OUTPUT.value}/layers.csv, layers.png')
  return 0


if __name__ == '__main__':
  cli.run(main)
