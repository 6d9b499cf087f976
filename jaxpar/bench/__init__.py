"""`python -m jaxpar.bench`: run partitionings side by side and report speedup, efficiency,
memory, communication bytes and the pipeline bubble, with plots. See __main__ for the command."""
