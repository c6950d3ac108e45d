"""nbxcert's embedded tensor/kernel library (import name `nbxcert.kernels`).

The tensor layer (`tensor`, `dtypes`), the backends (`backends.cuda`, `backends.interpreter`) and one module per kernel
family, each ending in one validated `KernelSpec`. Nothing here imports the CLI or the certification engine.
"""
