"""What the matrix runs on each target: the parts of the suite.

smoke: what .ci/run runs on every kernel for every submission. It covers the
paths that differ between KVMs (resolver vcpu and its bare EFAULT, MINOR,
WP, MOVE, prefetch with vCPU resolvers, io_uring readers, the page server
over loopback) in a few minutes of TCG time a kernel.
full: the whole suite, as the README runs it (a developer's command: about
five times the host's time under TCG).
"""
SMOKE = [
    "tests/test_resolver.py",
    "tests/test_move.py",
    "tests/test_wp.py",
    "tests/test_io_uring.py::test_every_read_is_a_completion_of_the_readers_ring",
    "tests/test_prefetch.py::test_readahead_cuts_sequential_faults_by_its_window",
    "tests/test_fault_paths.py",
    "tests/test_host_facts.py",
]

PARTS = {
    "smoke": SMOKE,
    "full": [],       # no arguments: pytest's testpaths, the whole suite
}
