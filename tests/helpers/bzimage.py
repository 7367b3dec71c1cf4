"""A file with an x86 bzImage's setup header and nothing else: enough for
uffdkvm.kernels to read a kernel's release from, never to boot."""


def write_bzimage(path, version):
    """Writes it at ``path``, its version string ``version`` (bytes, its first
    word the release); returns the path."""
    data = bytearray(0x1000)
    data[0x202:0x206] = b"HdrS"                                  # the boot protocol's magic
    data[0x20E:0x210] = (0x600 - 0x200).to_bytes(2, "little")    # where the version is, less 0x200
    data[0x600:0x600 + len(version) + 1] = version + b"\0"
    path.write_bytes(bytes(data))
    return path
