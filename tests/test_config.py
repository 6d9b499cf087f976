"""Every validation error: raised before compiling, one line, saying how to fix it."""

import re
from pathlib import Path

import pytest

from configs import base
from jaxpar import config as config_lib
from jaxpar import mesh as mesh_lib
from jaxpar import parallel
from tests.util import override


def make(**overrides):
    return override(base.get_config(), overrides)


@pytest.mark.parametrize(
    "overrides,devices,message",
    [
        ({"mesh_shape": (4, 1, 1)}, 8, "needs 4 devices but 8 are present"),
        ({"mesh_shape": (3, -1, 1)}, 8, "present"),
        ({"mesh_shape": (8, 1)}, 8, "must be 3 integers, one per axis of mesh_axes"),
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
        ({"model.name": "resnet18"}, 8, "unknown model.name 'resnet18'"),
        ({"pipeline.schedule": "zigzag"}, 8, "unknown pipeline.schedule"),
        ({"optimizer.name": "lamb"}, 8, "unknown optimizer.name"),
        ({"model.dtype": "float16"}, 8, "unknown model.dtype"),
        ({"sync.impl": "horovod"}, 8, "unknown sync.impl"),
        ({"pipeline.num_microbatches": -1}, 8, "num_microbatches"),
        ({"learning_rate": 0.0}, 8, "learning_rate must be positive"),
        ({"log_every_steps": 0}, 8, "log_every_steps"),
    ],
)
def test_validation_errors(overrides, devices, message):
    with pytest.raises(config_lib.ConfigError) as info:
        parallel.validate(make(**overrides), devices)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def refusal(config, devices: int) -> str:
    with pytest.raises(config_lib.ConfigError) as info:
        parallel.validate(config, devices)
    return str(info.value)


def apply_hints(config, text: str) -> list:
    """Each `mesh_shape=(...)` fix a message offers, applied to a copy of `config`, with the
    `--config.num_devices=N` that follows it (if any)."""
    fixes = []
    for mesh, n in re.findall(r"mesh_shape='\(([\d,]+)\)'(?: --config.num_devices=(\d+))?", text):
        fix = {"mesh_shape": tuple(int(x) for x in mesh.split(","))}
        fixes.append(
            override(config.copy_and_resolve_references(), fix | {"num_devices": int(n or 0)})
        )
    return fixes


def test_a_smaller_mesh_is_offered_the_first_devices():
    text = refusal(make(mesh_shape=(4, 1, 1)), 8)
    assert text == (
        "mesh (data=4, stage=1, tensor=1) needs 4 devices but 8 are present; choose sizes whose "
        "product is 8, e.g. --config.mesh_shape='(8,1,1)', or keep this mesh on the first 4 "
        "devices: --config.num_devices=4"
    )
    kept = make(mesh_shape=(4, 1, 1), num_devices=4)
    assert sizes(parallel.validate(kept, config_lib.device_count(kept, 8))) == (4, 1, 1)
    assert sizes(parallel.validate(make(mesh_shape=(8, 1, 1)), 8)) == (8, 1, 1)
    assert "--config.num_devices=6" in refusal(make(mesh_shape=(-1, 1, 3)), 8)  # 2*3 of 8
    kept = make(mesh_shape=(-1, 1, 3), num_devices=6)
    assert parallel.validate(kept, config_lib.device_count(kept, 8)) == {
        "data": 2,
        "stage": 1,
        "tensor": 3,
    }
    assert "num_devices" not in refusal(make(mesh_shape=(16, 1, 1)), 8)  # too few: no subset


def test_sync_mode_hints_name_meshes_that_validate():
    """Every mode runs on hybrid meshes but `independent` on stages; its refusal names meshes
    that work."""
    config = make(
        **{"mesh_shape": (2, 4, 1), "sync.mode": "independent", "sync.batch_norm": "local"}
    )
    text = refusal(config, 8)
    assert text == (
        "sync.mode=independent cannot combine with pipeline stages (every replica evaluates "
        "the whole eval set on its own, which a pipeline's micro-batched evaluation over the "
        "replicas' rows does not do); use sync.mode=allreduce, or "
        "--config.mesh_shape='(8,1,1)', or --config.mesh_shape='(2,1,1)' --config.num_devices=2"
    )
    fixes = apply_hints(config, text)
    assert len(fixes) == 2
    for fixed in fixes:
        n = config_lib.device_count(fixed, 8)
        assert sizes(parallel.validate(fixed, n)) == tuple(fixed.mesh_shape)


def sizes(shape: dict) -> tuple:
    return tuple(shape.values())


def test_valid_configs_resolve_the_mesh():
    assert parallel.validate(make(), 8) == {"data": 8, "stage": 1, "tensor": 1}
    assert sizes(parallel.validate(make(mesh_shape=(4, 1, 1)), 4)) == (4, 1, 1)
    assert mesh_lib.resolve_shape((-1, 1, 1), 2) == (2, 1, 1)


# Every shipped config file: the mesh it means on its default 8 devices (-1 resolved) and the
# model it trains.
SHIPPED = {
    "vgg19_data": ((8, 1, 1), "vgg19"),
    "vgg19_hybrid": ((2, 2, 2), "vgg19"),
    "vgg19_pipeline": ((2, 4, 1), "vgg19"),
    "vgg19_tensor": ((1, 1, 8), "vgg19"),
    "vgg19_conv_in": ((2, 1, 4), "vgg19"),
    "vgg19_sync": ((8, 1, 1), "vgg19"),
    "vgg19_adascale": ((8, 1, 1), "vgg19"),
    "resnet20": ((8, 1, 1), "resnet20"),
    "densenet40": ((8, 1, 1), "densenet40"),
    "alexnet": ((8, 1, 1), "alexnet"),
    "resnet50": ((2, 4, 1), "resnet50"),
}


def test_config_files_load_and_validate():
    """Each config file in configs/, loaded from its path as --config loads it, validates on
    the devices it asks for to the mesh it is named for; none is left out of the table."""
    from pathlib import Path

    from jaxpar import configfile

    files = {p.stem for p in Path(configfile.ROOT, "configs").glob("*.py")} - {"__init__", "base"}
    assert files == set(SHIPPED)
    for name, (mesh, model) in SHIPPED.items():
        config = configfile.load(str(Path(configfile.ROOT, "configs", f"{name}.py")))
        assert config.host_device_count == 8 and config.model.name == model, name
        assert sizes(parallel.validate(config, config.host_device_count)) == mesh, name


def test_unknown_dataset_is_one_line():
    from jaxpar import data

    with pytest.raises(data.DataError) as info:
        data.load(make(**{"data.name": "no_such_dataset_xyz", "data.data_dir": "/nonexistent"}))
    assert "\n" not in str(info.value)


def _docstring_commands(doc: str) -> list[list[str]]:
    """The `--config.KEY=VALUE` arguments of each command a config's docstring offers: a
    `python -m jaxpar.train --config configs/NAME.py ...` line or a `... --config...` line
    (the same file) with its continuation lines, and each backticked `--config...` span."""
    import re
    import shlex

    doc = doc.replace("\\\n", " ")  # a shell line continuation
    command = re.compile(
        r"(?:python -m jaxpar\.train --config configs/\w+\.py|^\s*\.\.\.)"
        r"((?:[ \t]+|\n[ \t]+(?=--config))--config\.\S+)*",
        re.MULTILINE,
    )
    found = [match.group(0) for match in command.finditer(doc)]
    found += re.findall(r"`(--config\.[^`]+)`", doc)
    return [[a for a in shlex.split(text) if a.startswith("--config.")] for text in found]


def test_every_command_a_config_file_offers_validates():
    """The commands in configs/*.py docstrings run as written on the default 8 devices: each
    validates, the model's refusals included (mesh, divisibility, a split the model cannot
    take), without compiling."""
    import inspect
    from pathlib import Path

    from jaxpar import configfile, models
    from jaxpar.errors import ConfigError
    from jaxpar.predict.programs.workload import input_spec

    checked = set()
    for path in sorted(Path(configfile.ROOT, "configs").glob("*.py")):
        module = configfile.load  # loaded as --config loads it
        text = path.read_text()
        doc = inspect.cleandoc(text.split('"""')[1]) if text.startswith('"""') else ""
        for args in _docstring_commands(doc):
            config = module(str(path))
            overrides, rest = configfile.split_overrides(args)
            assert not rest, (path.name, rest)
            configfile.override(config, overrides)
            try:
                shape = parallel.validate(config, config.host_device_count)
                image, classes = input_spec(config)
                parallel.check_model(config, shape, models.build(config.model, image, classes))
            except ConfigError as e:
                raise AssertionError(f"{path.name}: {' '.join(args)}: {e}") from None
            checked.add(path.name)
    # every config file offers a command (base.py its overrides' examples), and each is read
    configs = {p.name for p in Path(configfile.ROOT, "configs").glob("*.py")}
    assert checked == configs - {"__init__.py"}


@pytest.mark.parametrize(
    "arg",
    [
        "--config.mesh_shape=(2,2,2)",
        "--config.mesh_shape=8",
        '--config.mesh_axes=("data","spatial")',
        "--config.model.dtype=bfloat16",
        "--config.model.batch_norm=false",
        "--config.learning_rate=1",
        "--config.pipeline.split=(4,8,12)",
        "--config.pipeline.split=time",
        "--config.tensor.rules=(('conv_out','tensor'),)",
        "--config.model.name=1",
    ],
)
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags' loader
def test_overrides_parse_as_train_parses_them(arg):
    """The bench, plan and predict read `--config.KEY=VALUE` as train's config_flags does."""
    from absl import flags
    from ml_collections import config_flags

    from jaxpar import configfile

    path = str(Path(configfile.ROOT, "configs", "vgg19_data.py"))
    argv = ["train", f"--config={path}", arg]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    trained = flag_values.config
    overrides, rest = configfile.split_overrides([arg])
    assert rest == []
    ours = configfile.override(configfile.load(path), overrides)
    assert ours.to_dict() == trained.to_dict()
    (key,) = overrides
    assert type(overrides[key]) is type(
        config_flags.get_override_values(flag_values["config"])[key]
    )


def test_bad_override_value_fails_in_override():
    """A value config_flags refuses for the field's type stays text; override refuses it."""
    from jaxpar import configfile

    overrides, _ = configfile.split_overrides(["--config.global_batch_size=abc"])
    with pytest.raises(TypeError, match="global_batch_size"):
        configfile.override(configfile.load("configs/vgg19_data.py"), overrides)
    overrides, _ = configfile.split_overrides(["--config.model.widht=0.5"])
    with pytest.raises(KeyError, match="unknown config key 'model.widht'"):
        configfile.override(configfile.load("configs/vgg19_data.py"), overrides)


def test_override_args_read_back_as_the_same_values():
    """What the bench hands its row and predictor processes reads back unchanged."""
    from jaxpar import configfile

    overrides = {
        "mesh_shape": (2, 2, 2),
        "mesh_axes": ("data", "spatial"),
        "model.dtype": "bfloat16",
        "model.batch_norm": False,
        "model.width": 0.125,
        "pipeline.split": (4, 8),
        "tensor.rules": (("conv_out", "tensor"),),
        "data.name": "synthetic",
    }
    assert configfile.split_overrides(configfile.override_args(overrides)) == (overrides, [])
    listed = configfile.override_args({"mesh_shape": [8, 1, 1]})  # a manifest's JSON list
    assert configfile.split_overrides(listed)[0] == {"mesh_shape": (8, 1, 1)}
