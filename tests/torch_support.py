"""Helpers the megawino.torch tests share (imported only after torch is known to be there)."""
import torch
import torch.nn.functional as F


def rel_l2(y, ref) -> float:
    """Relative L2 error of ``y`` against ``ref``, in float64."""
    ref = ref.detach().double()
    return float((y.detach().double() - ref).norm() / ref.norm())


def reference(x, w, b=None, stride=1, padding=0):
    """float64 F.conv2d."""
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride, padding)


def randn(rng, *shape):
    """Standard normal values on the generator's device."""
    return torch.randn(*shape, generator=rng, device=rng.device)
