"""What the tests share besides fixtures, each imported by name from its own
module (``from helpers.hostfacts import NO_KVM, host_skip``); conftest.py
holds only fixtures and pytest's hooks.

hostfacts     the facts about this host that every skip cites, and the skip
              audit (a pytest plugin, loaded by conftest.py)
skips         skips that cite them: needs_test_hooks(), needs_io_uring(), ...
runs          small runs that must verify: small(), run_or_skip(), run_with_fault()
resources     what a run must give back: resources(), assert_released()
guest_clock   whether a run put the guest's stamps on the readers' clock
children      child Python processes that import the uffdkvm under test
broken_host   hosts without KVM or userfaultfd, built for real
cgroups       real cgroups: made, limited, entered by a child, removed
evidence      independent records of what a run did (the trace as numpy, /proc)
pagewire      the page server's handshake, written again in Python
bzimage       a file with a bzImage's setup header, for uffdkvm.kernels
archive       a Debian archive nothing serves, for kernels that cannot be fetched
machine_lock  the lock pytest-xdist's workers share (``alone`` tests)
"""
