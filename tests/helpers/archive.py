"""A Debian archive nothing serves, for the tests of a kernel that cannot
be fetched (uffdkvm.kernels, tests/matrix)."""


def unreachable_archive(monkeypatch, tmp_path):
    """uffdkvm.kernels pointed at 127.0.0.1:9 (discard: nothing listens), with
    a kernel cache of its own, and apt told not to retry: its default of
    three retries waits 7 s before it gives up, for the same answer."""
    config = tmp_path / "apt.conf"
    config.write_text('Acquire::Retries "0";\n')
    monkeypatch.setenv("APT_CONFIG", str(config))
    monkeypatch.setenv("UFFDKVM_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("UFFDKVM_DEBIAN_MIRROR", "http://127.0.0.1:9")
