"""Only the C part of the build; everything else is declared in pyproject.toml.

The extension is optional: without a C compiler the install still succeeds and the hook runs its
Python wrapper, which is the reference implementation (collectors/hooks/hook_fastcall.c says why C).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("rankscope.collectors.hooks.hook_fastcall",
                             ["collectors/hooks/hook_fastcall.c", "collectors/hooks/hook_ring.c"],
                             depends=["collectors/hooks/hook_ring.h"], optional=True, extra_compile_args=["-O2"])])
