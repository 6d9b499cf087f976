"""A compiled program's kernels: its operation classes (opclass), its matrix kernels (matrix, and
XLA:GPU's cuDNN and cuBLAS calls: library), a GPU's measured matrix-kernel costs
(kernel_table) and a model's convolution layers as rows of such a table (model_layers)."""
