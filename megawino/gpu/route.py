"""The one launch route of every GPU call: ``megawino.conv2d``, a plan's own call and
``megawino.torch``.

1. The arrays are checked once against the layer's spec (:func:`megawino.gpu.call_checks.prepare_call`
   for a plan's call, :func:`megawino.gpu.call_checks.check_call` for ``megawino.conv2d``: one set
   of checks), before anything launches.
2. A :class:`Route` binds a plan to one weight (its array and ``weight_token``) and one stream.
   Its first call runs the plan (``plan.run``: the weight is prepared under the token); its
   second binds the plan's launches into a :class:`megawino.gpu.launch.Launcher` once, and each
   call from then on only sets the input and output pointers.  Calls without a token, with ``check=False``,
   under CUDA-graph capture, or after a cache dropped what the launcher reads, run the plan
   as the first call does.

A plan keeps its routes (at most :data:`MAX_ROUTES`: a few weights times a few streams), so they
go with it when the runtime's plan cache drops it (:func:`forget`).  A route's launcher keeps
its weight array and prepared weight alive until the route is replaced (a new token for the
same weight memory), pruned or forgotten.
"""
from __future__ import annotations

import threading

from . import workspace

__all__ = ["Route", "route", "launch", "forget", "MAX_ROUTES"]

_LOCK = threading.Lock()
MAX_ROUTES = 8       # routes per plan: the weights of its shape's layers x the streams they run on


class Route:
    """``plan`` bound to the weight ``weight`` under ``token`` on the stream ``stream`` (its
    handle); calling it launches the layer on checked, kernel-ready arrays."""

    __slots__ = ("plan", "weight", "token", "stream", "launcher", "called")

    def __init__(self, plan, weight, token, stream: int):
        self.plan, self.weight, self.token, self.stream = plan, weight, token, stream
        self.launcher = None
        self.called = False       # a call ran the plan: the weight is prepared under the token

    def bound(self):
        """The launcher when it can run the next call as it is (made, everything it reads still
        cached, the stream not being captured), else None."""
        launcher = self.launcher
        if launcher is None or not launcher.valid() or workspace.is_capturing():
            return None
        return launcher

    def bind(self, x):
        """The launcher (made now where missing or stale, after a call has prepared the weight
        under the token), or None where the plan has none for this weight: no token, the
        prepared weight not ready, or capture; ``x`` stands for every later input."""
        if self.token is None or workspace.is_capturing():
            return None
        launcher = self.launcher
        if launcher is None or not launcher.valid():
            launcher = self.launcher = self.plan.launcher(x, self.weight, self.token)
        return launcher

    def __call__(self, x, out, check: bool = True):
        """The layer of ``x`` (checked and kernel-ready) into ``out``, launched on the current
        stream (this route's); ``check``: raise first for a fired watchdog (see the plans)."""
        if check and self.token is not None:
            launcher = self.bound()
            if launcher is None and self.called:
                # The route's second call binds the launcher: a token used once costs no binding.
                launcher = self.bind(x)
            if launcher is not None:
                launcher.launch(x.data.ptr, out.data.ptr)
                return out
        self.called = True
        return self.plan.run(x, self.weight, out, check, self.token)


def route(plan, w, weight_token) -> Route:
    """The route of ``plan`` for the weight memory ``w`` under ``weight_token`` on the current
    stream (made on first use; a route without a token is not kept).  A new token for the same
    weight memory replaces the route, so the launcher of the weight's earlier contents goes."""
    stream = workspace.current_stream_ptr()
    if weight_token is None:
        return Route(plan, w, None, stream)
    routes = plan.__dict__.get("_routes")
    if routes is None:
        routes = plan.__dict__.setdefault("_routes", {})
    key = (w.data.ptr, stream)
    found = routes.get(key)
    if found is None or found.token != weight_token:
        with _LOCK:              # threads on other streams make their routes at the same time
            if key not in routes and len(routes) >= MAX_ROUTES:
                _prune(routes)
            found = routes[key] = Route(plan, w, weight_token, stream)
    return found


def _prune(routes: dict) -> None:
    """Make room: drop the routes whose launcher is gone or stale (a cache dropped what it
    reads), else all of them."""
    stale = [key for key, found in routes.items() if found.launcher is None or not found.launcher.valid()]
    for key in stale or list(routes):
        del routes[key]


def launch(plan, x, w, out, check: bool = True, weight_token=None, copied_weight: bool = False):
    """Launch ``plan`` on checked, kernel-ready ``x``, ``w``, ``out`` through its route.  A call
    no launcher should take keeps no route: without a token, with ``check=False``, or with a
    ``copied_weight`` (the caller's weight was copied for the kernels: new memory every call)."""
    if weight_token is None or not check or copied_weight:
        return plan.run(x, w, out, check, weight_token)
    return route(plan, w, weight_token)(x, out, check)


def forget(plan) -> None:
    """Drop ``plan``'s routes (and the launchers and weights they keep)."""
    plan.__dict__.pop("_routes", None)
