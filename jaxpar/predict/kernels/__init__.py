"""A compiled program's kernels: its operation classes (opclass), its matrix kernels (matrix, and
XLA:GPU's cuDNN and cuBLAS calls: library) and a GPU's measured matrix-kernel costs
(kernel_table)."""
