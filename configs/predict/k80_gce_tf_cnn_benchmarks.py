"""tf_cnn_benchmarks' published table "k80_gce" (configs/predict/tf_cnn_benchmarks.py): every model
on 1, 2, 4 and 8 GPUs, data-parallel, against its published images/sec and efficiency.

Run:  python -m jaxpar.predict --profile configs/hardware/k80_pcie.py --suite configs/predict/k80_gce_tf_cnn_benchmarks.py
"""

from configs.predict.tf_cnn_benchmarks import table_suite


def get_config():
    return table_suite("k80_gce")
