"""SGLang on CPU: the environment builder and a pure-torch ``sgl_kernel`` stand-in.

PyPI has no CPU build of SGLang's kernel package; ``sgl_kernel/`` here is the project's own
replacement (installed into the SGLang environment by ``build_env``), implementing from their
semantics the CPU ops that plain and speculative serving call.
"""
