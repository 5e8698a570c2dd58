"""Program: the training program behind `python -m scripts.train`.

  config           -- `TrainConfig`: a run's configuration, checked (no TF import).
  assembly         -- building a run's parts from its configuration (`Session`).
  preflight        -- the noise multiplier (given or calibrated) and its memory, checked before building.
  program_logic    -- the round loop (`train_model`), which reads no configuration.
  run_directory    -- a run directory's lifecycle: lock, records, refusals (no TF import).
  run_records      -- a run directory as a checked record (atomic, hash-chained).
  checkpoints      -- owner-only checkpoints (a banded ring written one vector a round); `share`.
  release_evidence -- what a run directory proves was released.
  release_managers -- the `tff.program.ReleaseManager`s a round's values go to.
  tff_tree         -- TFF's tree-aggregation baseline, seeded from the run's key.
  plotting         -- the run's PNG plot.
  training         -- `run(config, task_builder)`: the program, end to end.

The top of the library: imports from every subsystem; nothing imports it.
"""
