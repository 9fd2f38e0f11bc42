"""Peer baselines that `slidedp bench --peers ...` runs next to SlideDP, on the same machine, in the same command.

A comparison is only fair when the peer runs at its best on the same host in the same run: fused optimizers where
the peer accepts them, CPU threads set explicitly, activation checkpointing only where it is needed to fit, the
same model shape, data, learning rate and clipping. Each peer is one module with one entry point returning a row
dict with the keys SlideDP's bench rows use (step_s, tokens_per_s, hbm_peak_gib, host_rss_gib, losses).

- `fsdp2`: PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`), GPU-resident or with `CPUOffloadPolicy`.
- `deepspeed_zero`: DeepSpeed ZeRO-2 with CPU optimizer offload and ZeRO-3 with CPU parameter and optimizer
  offload (DeepSpeedCPUAdam); DeepSpeed is not a dependency: scripts/build_peer_wheels.sh builds what it needs.
- `launch`: what both share (fresh rank interpreters over a file:// rendezvous, the row, OOM and error rows).

The modules import no torch at module level: the launching process (a bench command, a web worker's job process)
stays free of CUDA; only the rank processes they start import torch.
"""

__all__ = ["run_deepspeed", "run_fsdp2"]


def __getattr__(name: str):
    # lazy, so that `python -m slidedp.peers.fsdp2` does not find its module already imported by the package
    if name == "run_fsdp2":
        from slidedp.peers.fsdp2 import run_fsdp2

        return run_fsdp2
    if name == "run_deepspeed":
        from slidedp.peers.deepspeed_zero import run_deepspeed

        return run_deepspeed
    raise AttributeError(name)
