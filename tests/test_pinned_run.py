"""The program's behaviour, pinned: a seeded DP run releases the same bits.

Whatever the layout of the code that runs it (the run directory, the
assembly from a configuration, the round loop), a 3-round seeded DP run of
`scripts.program.run` releases the same rows, DP events, final state and
epsilon, to the bit.
"""

import hashlib
import json

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
# SHA-256 of releases.jsonl (rows, DP events, hash chain) and of the last
# checkpoint's state (every leaf's dtype, shape and bytes: the model, the
# optimizer, the aggregator's state and its noise key).
PINNED_RELEASES_SHA256 = (
    '01970ec7009a865c21299efb8668e7fce12fb288407ab9c805cca08699793e5b')
PINNED_STATE_SHA256 = (
    '9cec85ef173d8c8db2ba058cdc083bd5a8ff199a33c4ad2a6e01867ef5404f53')
PINNED_EPSILON_PER_ROUND = [[1, 6.85169723745637], [2, 8.30747417567243],
                            [3, 9.31927347809299]]
# PLD's final figure, 9.319273822098607 on the grid relative to RDP, is
# 9.31927347809299 on its power-of-two grid; RDP's 10.9067 is no longer shown.
PINNED_SUMMARY = dict(
    accountant='pld', epsilon=9.31927347809299,
    final_eval_accuracy=0.11977715790271759,
    final_eval_loss=2.2606115341186523, noise_multiplier=0.5,
    population_size=50, rounds=3)


def _state_sha256(checkpoint):
  digest = hashlib.sha256()
  with np.load(checkpoint) as data:
    for name in sorted(n for n in data.files if n.startswith('leaf_')):
      leaf = data[name]
      digest.update(str(leaf.dtype).encode())
      digest.update(str(leaf.shape).encode())
      digest.update(leaf.tobytes())
  return digest.hexdigest()


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
  assert (run_dir / 'metrics.csv').read_bytes().decode() == (
      PINNED_METRICS_CSV)
  assert hashlib.sha256((run_dir / 'releases.jsonl').read_bytes()
                        ).hexdigest() == PINNED_RELEASES_SHA256
  assert _state_sha256(run_dir / 'checkpoints' / 'round_000003.npz') == (
      PINNED_STATE_SHA256)
  ledger = json.loads((run_dir / 'ledger.json').read_text())
  assert ledger['epsilon_per_round'] == PINNED_EPSILON_PER_ROUND
  assert {k: summary[k] for k in PINNED_SUMMARY} == PINNED_SUMMARY
