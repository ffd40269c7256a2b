"""The measured cost model (``backend.cost_model=measured``): a step priced from kernels others
timed on real GPUs (Vidur's profiles, shipped as an extract in ``data/``), not from datasheet
efficiencies. ``profiles`` reads the extract, ``gemm`` fits each GPU's matmul time surface,
``elementwise`` the per-token operations, ``attention`` prices attention from FLOPs and bytes at
published kernel efficiencies, ``collectives`` the all-reduce, ``engine_cpu`` the engine's per-step
CPU work, and ``step`` adds them up for a step's plan."""
