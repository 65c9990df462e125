"""Reports: figures, the results sheet (summary.json) and Markdown."""
