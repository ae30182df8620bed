"""The CPU executor: a layer's task list run in ticket order on host buffers laid out like the
GPU's (``megawino.conv2d_cpu``).  Imports :mod:`megawino.core` and :mod:`megawino.schedule`."""
