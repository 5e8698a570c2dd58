"""Learning: what clients and the server do with the model.

  client      -- client work: FAT-Clipping, local clipping, BLUR, LUS, model clipping.
  sparsification -- LUS, Local Update Sparsification: scores, masks, keep counts.
  optimizers  -- per-step clipped optimizer, LAMB, LARS, schedules.
  server_step -- `oscillation_damped`, `growth_held`: a server step that follows the released updates.
  algorithms  -- `build_fedavg`: one call composing client work, aggregation and server optimizer.
  evaluation  -- `ServerEvaluation`: loss and accuracy on server-held data, in plain TensorFlow.

Imports from `tff_clip.aggregation`, never from above.
"""
