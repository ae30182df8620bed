"""One module per Winograd stage, mirroring ``cuda/<stage>.cuh``.

Each module's ``run_task`` is the CPU version of one task of that stage: it reads
and writes only the slices of the shared buffers (U, V, M of
:class:`megawino.tasks.Layout`) that the task owns, exactly as the CUDA device
function of the same name does.
"""
from ..tasks import TaskType
from . import filter_transform, gemm, input_transform, output_transform

RUNNERS = {
    TaskType.FILTER: filter_transform.run_task,
    TaskType.INPUT: input_transform.run_task,
    TaskType.GEMM: gemm.run_task,
    TaskType.OUTPUT: output_transform.run_task,
}
