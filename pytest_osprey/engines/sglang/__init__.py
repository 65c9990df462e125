"""SGLang: the booted server's command line, its stream, its drafts' checks, and the CPU build."""
