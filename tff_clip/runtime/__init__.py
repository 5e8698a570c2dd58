"""Runtime: where and how TFF computations run.

  execution        -- TFF C++ execution contexts whose workers never leak.
  tf_graphs        -- imported and traced TensorFlow graphs of TFF computations.
  simulation       -- the in-process runner of a learning process's rounds.
  split_execution  -- client work on TFF's C++ workers, the server here.
  client_data      -- clients' examples as tensors for the runner.

Imports only the root modules (`names`, `checks`).
"""
