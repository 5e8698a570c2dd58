"""Which path trains a round's clients: batched or client by client.

`clients(config, task, runner, noise_multiplier, server_parts)` gives the run's
`ClientDatasets` and its runner, wrapped in
`tff_clip.runtime.batched_clients.BatchedRunner` where `--client_execution`
and the run allow it. Both paths compute the same rounds (to float rounding:
the batched path sums the clients in another order), so the path is how a
run executes, not what it computes (`config.EXECUTION_KEYS`).
"""

from __future__ import annotations

__all__ = ['VECTORIZED_RECORDS_FROM', 'clients']

# tff_clip's DP queries bound a cohort's records as tensor ops over the
# client axis in every run (`dp_queries.summed_records`). Other queries
# (TFF's): runs of at least this many rounds compute the cohort's DP records
# all at once (`tf.vectorized_map` of the query's own `preprocess_record`),
# shorter ones client by client (a `tf.while_loop`, as TFF's `accumulate` sums
# them). All at once, the frontier's cohort call is 4.5 ms faster (11.2 ->
# 6.7 ms a round), but traces 1.8-2.5 s longer (the query's `tf.cond`s are
# converted branch by branch) for every graph it is traced for: a run earns
# that back only after about 400-550 rounds. (At 100 rounds, the frontier's
# 459 trainings took as long as with the loop, 21 min in one slow hour, its
# many new graphs' traces eating what the rounds saved.) A function of the
# run's configuration, so a run computes the same rounds (to the bit, with a
# fixed noise seed) in any process.
VECTORIZED_RECORDS_FROM = 500


def clients(config, task, runner, noise_multiplier, server_parts,
            trace_key=None):
  """(client datasets, runner, 'batched' or 'per_client').

  `server_parts(config, noise_multiplier)`: the process's (aggregator,
  server optimizer, client weighting) (`assembly.server_parts`).

  `trace_key`: the key the batched round's trace is kept under for this
  process's later runs (`process_cache.trace_key`; None: not kept).

  --client_execution=batched on a run the batched path cannot reproduce is
  a `config.ConfigError` naming why.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip.program import config as config_lib  # pylint: disable=g-import-not-at-top
  from tff_clip.program import hyperparameters  # pylint: disable=g-import-not-at-top
  from tff_clip.runtime import batched_clients  # pylint: disable=g-import-not-at-top
  from tff_clip.runtime import client_data  # pylint: disable=g-import-not-at-top
  from tff_clip.runtime import simulation  # pylint: disable=g-import-not-at-top
  wanted = config.client_execution
  datasets = client_data.ClientDatasets(
      task, config.seed, config.local_steps, batched=wanted != 'per_client')
  if wanted == 'per_client':
    return datasets, runner, 'per_client'
  reason = None
  # Exactly the in-process runner (or the cached one with this run's own
  # hyperparameter states, `hyperparameters.Rebased`): a SplitRunner
  # (`--executor=local`, `remote`) subclasses it but trains the clients on
  # TFF's workers.
  inner = (runner._runner if isinstance(runner, hyperparameters.Rebased)  # pylint: disable=protected-access
           else runner)
  if type(inner) is not simulation.InProcessRunner:  # pylint: disable=unidiomatic-typecheck
    reason = (f"--executor={config.executor} trains the clients on TFF's "
              'workers')
  elif config.audit_canaries:
    reason = "the audit's canaries live in the DP query"
  elif not datasets.can_batch:
    reason = "the task's client data cannot be batched as tensors"
  else:
    aggregator, _, weighting = server_parts(config, noise_multiplier)
    options = any(v is not None for v in (
        config.local_clip_norm, config.blur_strength, config.lus_sparsity))
    try:
      batched = batched_clients.BatchedRunner(
          runner, task.model_fn, aggregator, config.client_optimizer,
          weighting or tff.learning.ClientWeighting.NUM_EXAMPLES,
          client_options=options, trace_key=trace_key,
          vectorized_records=config.rounds >= VECTORIZED_RECORDS_FROM)
    except batched_clients.Unsupported as e:
      reason = str(e)
    else:
      small = batched.parameters <= batched_clients.SMALL_MODEL
      if small or wanted == 'batched':
        return datasets, batched, 'batched'
      reason = (f'the model has {batched.parameters:,} parameters, above '
                f'{batched_clients.SMALL_MODEL:,}: client by client is faster')
  if wanted == 'batched':
    raise config_lib.ConfigError(
        f'--client_execution=batched: {reason}; use --client_execution=auto '
        'or per_client.')
  datasets = client_data.ClientDatasets(task, config.seed, config.local_steps)
  return datasets, runner, 'per_client'
