"""Page sources beyond the backing itself (internal): the page server that
models a remote source (server.py: PageServer, PageClient, serve) and the
process it runs in (process.py, ``python -m uffdkvm.pages.process``). The
snapshot file a run pages from is made by :func:`uffdkvm.make_snapshot`;
``uffdkvm serve`` is the server as a user command (uffdkvm/cli/serve.py)."""
