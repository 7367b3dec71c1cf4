"""The declarations everything else is generated from or walks (internal):
every config field (fields.py), every result value (results.py) and every
test-only fault injection (faults.py). Each module imports nothing of
uffdkvm, so that tools/gen_schema.py loads it by its path before any build
and regenerates what derives from it."""
