"""The order tasks run in and what that order costs: ticket mappings and their validator, the
discrete-event simulator of the persistent megakernel, and timelines (simulated or measured).
Imports only :mod:`megawino.core`."""
