"""What a convolution is and how it splits into tasks, with NumPy and the standard library only:
the layer spec, the networks and the benchmark suite, the Winograd math, tasks, task sizes and the
task-type registry with each type's CPU body (``stages``), the host-kernel ABI, and where package
data and user files are.  Imports nothing else of megawino (docs/design.md, "Packages")."""
