#!/usr/bin/env python3
r"""How soon Ctrl-C ends a run: SIGINT to this process DELAY seconds into
run(**FIELDS), and the time from the signal to KeyboardInterrupt.

    python benchmarks/interrupt_latency.py \
        "dict(vcpus=2, mem_per_vcpu='2G', backing='shmem', uffd_mode='minor')" 6
"""
import os
import signal
import sys
import threading
import time

import uffdkvm


def main():
    fields = eval(sys.argv[1], {"__builtins__": {}, "dict": dict})  # dict(...), as above
    delay = float(sys.argv[2])
    sent = {}

    def fire():
        time.sleep(delay)
        sent["t"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=fire, daemon=True).start()
    start = time.monotonic()
    try:
        uffdkvm.run(**fields)
        print(f"finished {time.monotonic() - start:.3f} s in, before the signal")
    except KeyboardInterrupt:
        print(f"KeyboardInterrupt {time.monotonic() - sent['t']:.3f} s after the signal")


if __name__ == "__main__":
    main()
