"""Intel XPU: what milarun wires, and the one-line refusal of what it does not.

Wired (each uses ``torch.xpu`` as the CUDA path uses ``torch.cuda``):

* the rate logger's windows are timed with ``torch.xpu.Event`` (one sync per
  window, :class:`milarun.bench.device.XpuEventTimer`) and ``--no-instrument``
  ends with ``torch.xpu.synchronize``;
* ``matmul`` times each matmul with ``torch.xpu.Event``;
* ``infer`` runs one double-buffered pipeline per XPU the process sees;
* optimizers are fused and ``--precision fp16`` scales gradients
  (:mod:`milarun.bench.step`).

Refused with one line (a FAIL record with reason ``wrong-device``), never run
on the CPU under a record that says xpu:

* the data-parallel workloads (``ddp_convnet``, ``scaling``):
  :func:`milarun.bench.distributed.process_group` knows CUDA (``nccl``,
  ``cuda:LOCAL_RANK``) and the CPU (``gloo``) only;
* ``lightning_convnet``: Lightning 2.6 ships no XPU accelerator.
"""

from .device import Device, is_xpu
from .setup import WrongDevice

#: Why the data-parallel workloads refuse an XPU.
DDP_NOT_WIRED = (
    "data-parallel training on XPU needs the xccl backend and one xpu:LOCAL_RANK "
    "per rank, which milarun.bench.distributed does not set up yet"
)
#: Why lightning_convnet refuses an XPU.
LIGHTNING_NOT_WIRED = "Lightning 2.6 has no XPU accelerator"


def refuse_xpu(device: Device, workload: str, why: str) -> None:
    """Raise :class:`WrongDevice` when ``device`` is an XPU, else return.

    Args:
        device: the ``torch.device`` from ``init_torch``.
        workload: the workload's name, for the message.
        why: what is missing (:data:`DDP_NOT_WIRED`, :data:`LIGHTNING_NOT_WIRED`).
    """
    if is_xpu(device):
        raise WrongDevice(f"{workload} does not run on an Intel XPU: {why}")
