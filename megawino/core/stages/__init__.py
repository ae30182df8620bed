"""One module per Winograd stage, mirroring ``cuda/<stage>.cuh``.

Each module's ``run_task`` is the CPU version of one task of that stage: it reads
and writes only the slices of the shared buffers (U, V, M of
:class:`megawino.core.tasks.Layout`) that the task owns, exactly as the CUDA device
function of the same name does.  :mod:`megawino.core.task_types` registers them as the
task types' CPU runners.
"""
