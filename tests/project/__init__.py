"""The project as a whole: the layout and sizes of the code, static checks, the
generated files (schema), packaging, the docs and their examples, notebooks,
CI and the kernel matrix, the C core under sanitizers and fuzzing, and the
lock the suite's workers share.
"""
