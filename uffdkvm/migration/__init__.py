"""Live migration (internal; the public names are uffdkvm.migrate,
uffdkvm.MigrationResult and uffdkvm.migration_sweep): one migration of a
running guest (migrate.py) and a grid of them (sweep.py)."""
