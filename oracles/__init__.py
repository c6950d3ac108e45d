"""Float64 reference implementations (numpy, mpmath where float64 itself needs checking), one module per kernel
family. Nothing here imports nbxcert.kernels: an oracle shares no code with what it judges.
"""
