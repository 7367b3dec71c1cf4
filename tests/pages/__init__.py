"""Page sources (uffdkvm/pages/, uffdkvm/snapshot.py): snapshot files and
source="file", files changed under a run, the page server and who may read
from it, and source="remote" with its prefetch.
"""
