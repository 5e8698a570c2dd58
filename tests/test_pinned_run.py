"""The program's behaviour, pinned: a seeded DP run releases the same bits.

Whatever the layout of the code that runs it (the run directory, the
assembly from a configuration, the round loop), a 3-round seeded DP run of
`scripts.program.run` releases the same rows and DP events to the bit, the
same final state, and the same epsilon up to the machine's floating point
in its last digits (and to the bit dp_accounting's own on the machine).
"""

import csv
import io
import json

import dp_accounting
from dp_accounting import pld
import numpy as np
import pytest

from scripts import program
from tff_clip.program import training

# Released by a 3-round seeded DP run of the digits default (adaptive
# normalization, z = 0.5, 6 of 50 clients by Poisson sampling, --seed=3,
# --noise_seed=11), as computed by the code before the program was split
# into its run directory, assembly and round loop (commit 59a674d). Seeded
# noise and in-process rounds: equal to the bit from run to run.
# The target quantile is given: 0.3 was the default then (the default now
# follows the noise, `tff_clip.aggregation.noise_following`); so is the
# server step: a fixed one then (a DP run's default now damps it,
# `tff_clip.learning.server_step`, and releases its scale as a column).
# The clients are trained one by one, as then (`--client_execution=
# per_client`): the batched path sums in another order, so its final state
# differs from these bits by float rounding (test_batched_clients.py).
PINNED_CONFIG = dict(rounds=3, clients_per_round=6, eval_every=1, seed=3,
                     noise_seed=11, target_quantile=0.3, server_step='fixed',
                     client_execution='per_client')
# The epsilon column, releases.jsonl and the per-round epsilon changed when
# a run came to show one epsilon: every round's figure is the run's one
# accountant's (PLD, on a power-of-two grid, was RDP), the column names it
# and delta, and --noise_seed labels it NOT_PRIVATE. Nothing the training
# computes changed: the clip norms, evaluation and final state (its SHA-256)
# are the figures of commit 59a674d, to the bit (z is given: no calibration).
PINNED_METRICS_CSV = (
    'round,clip_norm,epsilon_NOT_PRIVATE_pld_delta_1e-05,eval_loss,'
    'eval_accuracy\n'
    '1,0.1045561358332634,6.85169723745637,2.343621253967285,'
    '0.10027854889631271\n'
    '2,0.11102153360843658,8.30747417567243,2.2850770950317383,'
    '0.12534819543361664\n'
    '3,0.1178867295384407,9.31927347809299,2.2606115341186523,'
    '0.11977715790271759\n')
# The last checkpoint's state, leaf by leaf: dtype, shape, and the L1 norm
# of a float leaf (else its value): the model, the optimizer, the
# aggregator's state and its noise key. (Its SHA-256 at 59a674d,
# 9cec85ef..., was not reproduced by the same commit on another x86 machine:
# TensorFlow's CPU kernels are not bit-identical across machines; the rows
# above are.)
PINNED_STATE = [
    ('float32', (64, 32), 261.68927939923014),
    ('float32', (32,), 0.4770186203531921),
    ('float32', (32, 10), 59.06080372305587),
    ('float32', (10,), 0.11497382982634008),
    ('float32', (), 0.10000000149011612),
    ('float32', (), 0.1178867295384407),
    ('float32', (), 0.550000011920929),
    ('int64', (2,), [11, 0]),
    ('int64', (), 3),
    ('float32', (), 0.1178867295384407),
    ('float32', (), 0.30000001192092896),
    ('float32', (), 0.20000000298023224),
    ('float32', (), 0.5),
    ('float32', (), 1.2001984119415283),
    ('int64', (2,), [12, 0]),
    ('int64', (), 3),
    ('float32', (), 6.0),
    ('float32', (), 6.0),
    ('|S22', (), b'dp_accounting.dp_event'),
    ('|S15', (), b'ComposedDpEvent'),
    ('|S22', (), b'dp_accounting.dp_event'),
    ('|S15', (), b'GaussianDpEvent'),
    ('float32', (), 0.550000011920929),
    ('|S22', (), b'dp_accounting.dp_event'),
    ('|S15', (), b'GaussianDpEvent'),
    ('float32', (), 1.2001984119415283),
    ('bool', (), False),
    ('float32', (), 1.0),
]
# Every round's DP event: 6 of 50 clients by Poisson sampling, the value's
# Gaussian and the clipped count's.
PINNED_EVENT = {
    'type': 'PoissonSampledDpEvent', 'sampling_probability': 0.12,
    'event': {'type': 'ComposedDpEvent', 'events': [
        {'type': 'GaussianDpEvent', 'noise_multiplier': 0.550000011920929},
        {'type': 'GaussianDpEvent', 'noise_multiplier': 1.2001984119415283}]}}
PINNED_EPSILON_PER_ROUND = [[1, 6.85169723745637], [2, 8.30747417567243],
                            [3, 9.31927347809299]]
# PLD's final figure, 9.319273822098607 on the grid relative to RDP, is
# 9.31927347809299 on its power-of-two grid; RDP's 10.9067 is no longer shown.
PINNED_SUMMARY = dict(
    accountant='pld', epsilon=9.31927347809299,
    final_eval_accuracy=0.11977715790271759,
    final_eval_loss=2.2606115341186523, noise_multiplier=0.5,
    population_size=50, rounds=3)


def _state(checkpoint):
  """The checkpoint's leaves as `PINNED_STATE` lists them."""
  leaves = []
  with np.load(checkpoint) as data:
    for name in sorted(n for n in data.files if n.startswith('leaf_')):
      leaf = data[name]
      figure = (float(np.abs(leaf.astype(np.float64)).sum())
                if leaf.dtype.kind == 'f' else leaf.tolist())
      leaves.append((str(leaf.dtype), leaf.shape, figure))
  return leaves


def _oracle_epsilon(ledger, rounds, grid):
  """dp_accounting's own PLD accountant on the ledger's rounds: each a
  Poisson-sampled pair of Gaussians (the value's and the clipped count's),
  one Gaussian of z = (z_1^-2 + z_2^-2)^-1/2."""
  (group,) = ledger['groups']
  event = group['event']
  z_1, z_2 = (e['noise_multiplier'] for e in event['event']['events'])
  accountant = pld.PLDAccountant(value_discretization_interval=grid)
  accountant.compose(dp_accounting.PoissonSampledDpEvent(
      event['sampling_probability'],
      dp_accounting.GaussianDpEvent((z_1**-2 + z_2**-2)**-0.5)), rounds)
  return accountant.get_epsilon(1e-5)


@pytest.mark.slow
def test_a_seeded_dp_run_releases_the_pinned_rows_state_and_epsilon(
    tmp_path):
  """Pins the behaviour of the code before the program was restructured
  (the figures above were computed once by that code): rows, DP events,
  final state and epsilon, to the bit."""
  summary = program.run(training.TrainConfig(
      root_output_dir=str(tmp_path), experiment_name='pinned',
      progress=False, **PINNED_CONFIG))
  run_dir = tmp_path / 'pinned'
  rows = list(csv.reader(io.StringIO(
      (run_dir / 'metrics.csv').read_text())))
  pinned = list(csv.reader(io.StringIO(PINNED_METRICS_CSV)))
  assert rows[0] == pinned[0]
  epsilon_column = 2
  for row, pinned_row in zip(rows[1:], pinned[1:], strict=True):
    # The training's figures to the bit.
    assert row[:epsilon_column] + row[epsilon_column + 1:] == (
        pinned_row[:epsilon_column] + pinned_row[epsilon_column + 1:])
    # Epsilon: PLD's sums in the last digits move with the machine's
    # floating point (dp_accounting's own accountant too).
    assert float(row[epsilon_column]) == pytest.approx(
        float(pinned_row[epsilon_column]), rel=1e-9)
  released = [json.loads(line) for line in
              (run_dir / 'releases.jsonl').read_text().splitlines()]
  assert [r['round'] for r in released] == [1, 2, 3]
  for release, row in zip(released, rows[1:]):
    assert [str(v) for v in release['row'].values()] == row
    assert release['event'] == PINNED_EVENT  # The DP event, to the bit.
  state = _state(run_dir / 'checkpoints' / 'round_000003.npz')
  assert [leaf[:2] for leaf in state] == [leaf[:2] for leaf in PINNED_STATE]
  for (_, _, figure), (_, _, expected) in zip(state, PINNED_STATE):
    if isinstance(expected, float):
      assert figure == pytest.approx(expected, rel=1e-6)
    else:
      assert figure == expected
  ledger = json.loads((run_dir / 'ledger.json').read_text())
  for (round_num, epsilon), (_, pinned_epsilon) in zip(
      ledger['epsilon_per_round'], PINNED_EPSILON_PER_ROUND, strict=True):
    assert epsilon == pytest.approx(pinned_epsilon, rel=1e-9)
  assert {k: summary[k] for k in PINNED_SUMMARY if k != 'epsilon'} == {
      k: v for k, v in PINNED_SUMMARY.items() if k != 'epsilon'}
  assert summary['epsilon'] == pytest.approx(PINNED_SUMMARY['epsilon'],
                                             rel=1e-9)
  # And to the bit what dp_accounting computes for these events here.
  grid = 2.0**-10  # The power-of-two grid of PLD at epsilon ~9.3.
  assert summary['epsilon'] == _oracle_epsilon(ledger['ledger'], 3, grid)
