"""The model the real backends run: one Llama-family definition (config, weights, forward).

``config`` describes the shape, ``weights`` makes weights from a seed or reads a Hugging Face
checkpoint folder, ``forward`` is the transformer step written once against a small set of
array primitives that ``ops_numpy`` and ``ops_torch`` implement, and ``runner`` turns an
engine step plan into that forward over the allocator's paged KV pool.
"""
