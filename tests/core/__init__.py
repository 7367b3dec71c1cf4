"""Config and run(): one experiment from its config to a verified result.

The fields and their refusals, the guest's walk and access models, the backings,
what `verified` checks, thread placement, dirty tracking, preinstalled pages,
replay files, progress, and the errors run() raises. How a fault is waited for
and resolved is in fault_paths/; what the numbers mean, in measurements/.
"""
