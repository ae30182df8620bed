"""The Winograd path on the GPU and what every GPU path shares: NVRTC compilation, plans,
workspaces, prepared weights, the checks before a launch, the per-shape algorithm choice,
CUDA-event timing, the cuDNN baseline and the generator of ``cuda/generated_*.cuh``.  CuPy is
imported on first use, never at import time."""
