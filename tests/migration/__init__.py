"""Live migration (uffdkvm/migration/): migrate() and migration_sweep()."""
