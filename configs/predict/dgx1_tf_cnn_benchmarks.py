"""tf_cnn_benchmarks' published table "dgx1" (configs/predict/tf_cnn_benchmarks.py): every model
on 1, 2, 4 and 8 GPUs, data-parallel, against its published images/sec and efficiency.

Run:  python -m jaxpar.predict --profile configs/hardware/dgx1_p100.py --suite configs/predict/dgx1_tf_cnn_benchmarks.py
"""

from configs.predict.tf_cnn_benchmarks import table_suite


def get_config():
    return table_suite("dgx1")
