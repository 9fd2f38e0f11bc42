"""The two tensor collectives of the step, under the names this torch has.

torch 2.13 renamed `all_gather_into_tensor` and `reduce_scatter_tensor` to `all_gather_single` and
`reduce_scatter_single` (same arguments) and warns on every call of the old names; older releases have only the old
ones. The step, the device update and calibration call these.
"""

from __future__ import annotations

import torch.distributed as dist

all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
