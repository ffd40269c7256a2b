"""Tensor parallelism for real: worker processes over ``torch.distributed``, each holding one
rank's slice of the model and of the KV pool, driven by the engine process (rank 0)."""
