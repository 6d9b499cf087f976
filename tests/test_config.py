"""Every validation error: raised before compiling, one line, saying how to fix it."""

import pytest

from configs import base
from jaxpar import config as config_lib
from jaxpar import mesh as mesh_lib
from tests.util import override


def make(**overrides):
    return override(base.get_config(), overrides)


@pytest.mark.parametrize(
    "overrides,devices,message",
    [
        ({"mesh_shape": (4, 1, 1)}, 8, "needs 4 devices but 8 are present"),
        ({"mesh_shape": (3, -1, 1)}, 8, "present"),
        ({"mesh_shape": (8, 1)}, 8, "three integers"),
        ({"mesh_shape": (0, 1, 1)}, 8, "positive"),
        ({"mesh_shape": (2, 1, 4), "sync.impl": "pmap"}, 8, "tensor axis needs sync.impl"),
        (
            {"mesh_shape": (1, 4, 1), "pipeline.schedule": "naive", "pipeline.num_microbatches": 4},
            4,
            "naive runs one micro-batch",
        ),
        (
            {"mesh_shape": (2, 4, 1), "pipeline.num_microbatches": 3, "global_batch_size": 10},
            8,
            "micro-batches of a multiple of 2",
        ),
        ({"mesh_shape": (1, 8, 1), "sync.impl": "pmap"}, 8, "pmap is data-parallel only"),
        ({"pipeline.split": "random"}, 8, "unknown pipeline.split"),
        ({"global_batch_size": 100, "mesh_shape": (8, 1, 1)}, 8, "not divisible by the data"),
        ({"eval_batch_size": 12, "mesh_shape": (8, 1, 1)}, 8, "eval_batch_size 12"),
        ({"num_train_steps": 0}, 8, "num_train_steps must be positive"),
        ({"global_batch_size": -8}, 8, "global_batch_size must be positive"),
        ({"model.name": "resnet50"}, 8, "unknown model.name 'resnet50'"),
        ({"pipeline.schedule": "zigzag"}, 8, "unknown pipeline.schedule"),
        ({"optimizer.name": "lamb"}, 8, "unknown optimizer.name"),
        ({"model.dtype": "float16"}, 8, "unknown model.dtype"),
        ({"sync.impl": "horovod"}, 8, "unknown sync.impl"),
        ({"pipeline.num_microbatches": 0}, 8, "num_microbatches"),
        ({"learning_rate": 0.0}, 8, "learning_rate must be positive"),
        ({"log_every_steps": 0}, 8, "log_every_steps"),
    ],
)
def test_validation_errors(overrides, devices, message):
    with pytest.raises(config_lib.ConfigError) as info:
        config_lib.validate(make(**overrides), devices)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_valid_configs_resolve_the_mesh():
    assert config_lib.validate(make(), 8) == (8, 1, 1)
    assert config_lib.validate(make(mesh_shape=(4, 1, 1)), 4) == (4, 1, 1)
    assert mesh_lib.resolve_shape((-1, 1, 1), 2) == (2, 1, 1)


def test_config_files_load_and_validate():
    import importlib

    for name in ("vgg19_data", "vgg19_hybrid", "vgg19_pipeline", "vgg19_tensor", "vgg19_conv_in"):
        module = importlib.import_module(f"configs.{name}")
        assert module.__doc__.lstrip().splitlines()[0]
        assert "python -m jaxpar.train --config configs/" in module.__doc__
        config_lib.validate(module.get_config(), 8)


def test_unknown_dataset_is_one_line():
    from jaxpar import data

    with pytest.raises(data.DataError) as info:
        data.load(make(**{"data.name": "no_such_dataset_xyz", "data.data_dir": "/nonexistent"}))
    assert "\n" not in str(info.value)
