"""What a step costs on this machine: one model for the budget estimate and the planner.

- ``shape``: FLOPs and bytes a model moves per token, per attention pair, per step;
- ``rates``: the machine's profile rates for one model entry (``kvmap.hardware``);
- ``roofline``: seconds of prefill and decode work from shape x rates x calibration;
- ``calibration``: the constants of that roofline and the measured fixed costs (a cell's
  fork and build, the probes, a worker's start, the run's own), one record per machine
  class and dtype, stored beside the hardware profile.

It stands at the engine's level: it may import ``config``, ``model``, ``kv`` and
``hardware``; ``bench``, ``plan`` and ``runs`` stand on it.
"""
