#!/usr/bin/env python3
"""What resolver="vcpu" pays on stock x86 KVM to find a fault's page.

Stock x86 KVM returns a bare EFAULT for a fault on shared memory, so the
vCPU thread reads the guest's registers (one KVM_GET_REGS) to learn the page
(docs/config.md, "Who resolves a fault"). This times that ioctl on a real
vCPU against KVM_GET_MP_STATE, a vCPU ioctl that does the same entry and
vcpu_load but copies 4 bytes, in interleaved batches:

    python3 benchmarks/get_regs_cost.py --trials 15 --calls 2000

It prints, per call, the median over trials of each ioctl's time (with a
bootstrap 95% interval), and their difference. The whole of KVM_GET_REGS is
what a fault costs more than on a KVM that names the page; compare it with
the per-page overhead from benchmarks/overhead.py --variant
"vcpu=--resolver vcpu" on the same host.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import time

import uffdkvm
from uffdkvm.host import facts as host

KVM_CREATE_VM = 0xAE01
KVM_CREATE_VCPU = 0xAE41
KVM_GET_REGS = 0x8090AE81       # _IOR(KVMIO, 0x81, struct kvm_regs): 144 bytes
KVM_GET_MP_STATE = 0x8004AE98   # _IOR(KVMIO, 0x98, struct kvm_mp_state): 4 bytes


def per_call_us(fd: int, request: int, size: int, calls: int) -> float:
    buf = bytearray(size)
    start = time.perf_counter_ns()
    for _ in range(calls):
        fcntl.ioctl(fd, request, buf)
    return (time.perf_counter_ns() - start) / calls / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    kvm = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    vm = fcntl.ioctl(kvm, KVM_CREATE_VM, 0)
    vcpu = fcntl.ioctl(vm, KVM_CREATE_VCPU, 0)
    try:
        regs, mp = [], []
        for trial in range(args.trials):
            order = [(regs, KVM_GET_REGS, 144), (mp, KVM_GET_MP_STATE, 4)]
            for out, request, size in order if trial % 2 == 0 else order[::-1]:
                out.append(per_call_us(vcpu, request, size, args.calls))
    finally:
        for fd in (vcpu, vm, kvm):
            os.close(fd)
    info = host.capture()
    print(f"{info.kernel_release}, {info.kvm_module}: {args.trials} trials of "
          f"{args.calls} calls each, interleaved")
    diffs = [a - b for a, b in zip(regs, mp, strict=True)]
    for name, xs in (("KVM_GET_REGS", regs), ("KVM_GET_MP_STATE", mp),
                     ("difference", diffs)):
        s = uffdkvm.spread_of(xs)
        print(f"  {name:17s} {s.median:8.2f} us per call  95% CI [{s.ci_low:.2f}, "
              f"{s.ci_high:.2f}]")


if __name__ == "__main__":
    main()
