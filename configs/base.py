"""Defaults shared by every experiment. Not run directly: experiments import and adjust it.

Every key here is public: users override it on the command line
(`--config.global_batch_size=256`, `--config.mesh_shape='(4,2,1)'`) and later work relies on it.
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.num_train_steps = 300
    config.global_batch_size = 128  # images per step over all devices
    config.eval_batch_size = 0  # 0: same as global_batch_size
    # Each device's batch is run as this many equal slices, their gradients summed (gradient
    # accumulation): the same step with a smaller working set. Data and tensor parallelism;
    # not with BatchNorm (its statistics would be per slice).
    config.grad_accum_steps = 1
    config.learning_rate = 0.05  # peak learning rate (before linear scaling, if on)
    config.lr_linear_scaling = False  # peak lr = learning_rate * global_batch / lr_base_batch_size
    config.lr_base_batch_size = 256  # the batch that learning_rate is meant for (Goyal et al.)
    # The noise scale's rule instead (McCandlish et al. 2018, eq. 2.6): with B_noise > 0 here,
    # peak lr = eps_max / (1 + B_noise / global_batch), eps_max fixed so that
    # lr_base_batch_size gets learning_rate (jaxpar/optim.py). 0: off.
    config.lr_noise_scale = 0.0
    # How the rate follows the measured gradient noise during the run: "none", or "adascale"
    # (Johnson et al. 2020, jaxpar/adascale.py): each step's rate is the schedule's rate at
    # the run's progress times AdaScale's gain (1 at lr_base_batch_size, up to B /
    # lr_base_batch_size), progress advancing by the gain. The run then ends when its progress
    # reaches num_train_steps (steps at lr_base_batch_size), and the schedule runs on progress.
    config.lr_adaptation = "none"
    config.lr_schedule = "cosine"  # "cosine" (warmup then cosine to 0) or "constant"
    config.warmup_steps = 20
    # Steps the learning-rate schedule spans (0: num_train_steps). Set it to continue a
    # finished run: its old value keeps the schedule, a larger one stretches it.
    config.schedule_steps = 0
    # adam: decoupled (AdamW, update -= lr * wd * param); sgd: wd * param added to the gradient.
    config.weight_decay = 0.0

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.name = "sgd"  # "sgd" (with momentum), "adam" or "lars" (You et al.)
    config.optimizer.momentum = 0.9  # sgd momentum; 0 for plain SGD
    config.optimizer.nesterov = False
    config.optimizer.trust_coefficient = 0.001  # lars: eta of the layer-wise trust ratio

    # The gradient noise scale B_simple (McCandlish et al. 2018) from the step's two gradient
    # sizes (jaxpar/noise_scale.py): per step in metrics.jsonl ("noise" lines), the run's
    # average in the summary. Its estimates are smoothed with this moving-average decay.
    config.measure_noise_scale = True
    # A batch, and a mesh, that follow the measured noise (jaxpar/batch_schedule.py; needs
    # lr_adaptation=adascale): "fixed", or "goodput": every goodput.every_steps steps the run
    # moves to the candidate with the most progress per second (Pollux's goodput): the
    # batches of goodput.batches (() = lr_base_batch_size x 1/4 .. x 32) in slices of at most
    # goodput.max_device_rows rows a device, on the config's mesh or (mesh_schedule=goodput)
    # on any of goodput.meshes. A candidate's step time is measured on its first use.
    config.batch_schedule = "fixed"
    config.mesh_schedule = "fixed"
    config.goodput = ml_collections.ConfigDict()
    config.goodput.every_steps = 50
    config.goodput.batches = ()
    config.goodput.meshes = ()
    config.goodput.max_device_rows = 32
    config.noise_scale_decay = 0.95
    config.log_every_steps = 20
    config.eval_every_steps = 100  # 0: evaluate only at the end
    # Time to a target (jaxpar/target.py): the first evaluation reaching it gives the
    # summary's steps_to_target, examples_to_target and time_to_target_s. 0: no target.
    config.target_accuracy = 0.0
    config.target_eval_loss = 0.0
    config.stop_at_target = False  # end the run at the first evaluation that reaches it
    # At the end, also evaluate the first N train images (inference mode, unaugmented): the
    # summary's train accuracy and the train/test gap. 0: none.
    config.eval_train_examples = 0
    config.checkpoint_every_steps = 100  # Orbax save every N steps and at the end; 0: none
    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.max_to_keep = 3
    # A run with no progress (step, eval batch, save) for this long, or for 20x its recent
    # step time if longer, prints every thread's stack and one line, and exits 1 (0: never).
    config.hang_timeout_s = 300
    # After Ctrl-C or SIGTERM the run saves at the end of the step; if it cannot within this
    # long (it is stuck), it says so in one line and exits 1 (0: wait for ever).
    config.stop_grace_s = 120

    # The mesh's named axes (jaxpar/axes/: data, node, fsdp, stage, tensor, spatial, or one
    # you register) and their sizes, one per axis; the product must equal the device count. One
    # size may be -1: it takes whatever the others leave (e.g. (-1, 1, 1) = all data).
    # E.g. --config.mesh_axes='("node","data")' --config.mesh_shape='(2,4)'.
    config.mesh_axes = ("data", "stage", "tensor")
    config.mesh_shape = (-1, 1, 1)
    # Which partitioning runs it (jaxpar/parallel/__init__.py: STRATEGIES). "auto": a pipeline
    # when the mesh has stages, tensor parallelism with a tensor axis, else data parallelism
    # (pmap when sync.impl=pmap). Name one to run a strategy you added on any mesh it accepts.
    config.strategy = "auto"
    # On a CPU-only machine, simulate this many devices (XLA_FLAGS) when jaxpar.train starts.
    # Ignored if XLA_FLAGS already sets a count; it does not affect GPUs or TPUs.
    config.host_device_count = 8
    # XLA's persistent compilation cache (jaxpar/compile_cache.py): "auto" is
    # $JAX_COMPILATION_CACHE_DIR if set, else ~/.cache/jaxpar/xla, shared by every run;
    # a path; or "" to compile everything afresh.
    config.compile_cache = "auto"
    # Use only the first N devices present (0: all), like tf_cnn_benchmarks' --num_gpus:
    # the 1-device baseline and scaling curves on one machine.
    config.num_devices = 0

    config.model = ml_collections.ConfigDict()
    # vgg11/13/16/19, lenet, resnet20/32/44/56/110, resnet50/152, densenet40/100, alexnet,
    # inception_v3
    config.model.name = "vgg19"
    config.model.width = 0.25  # channel multiplier: 1.0 is the published VGG
    config.model.batch_norm = True  # False: no BatchNorm (convs take a bias); AlexNet has none
    config.model.dtype = "float32"  # compute: float32 or bfloat16 (float32 params); float64 checks
    config.model.dropout = False  # lenet: Keras mnist_cnn's dropouts (0.25, 0.5) in training
    config.model.head = "auto"  # "cifar" (one dense), "imagenet" (three dense), "auto" by input
    # A user's own flax module (model.name=package.module:fn returning a flax.linen.Module):
    # the list attribute its __call__ runs in order, for a pipeline to cut between ("": an
    # nn.Sequential's layers, else one uncuttable layer), and regular expressions over its
    # parameter paths naming their dimensions where the module's annotations do not, e.g.
    # (("Conv_.*/kernel", (None, None, "conv_in", "conv_out")),)
    config.model.layers = ""
    config.model.param_rules = ()

    config.data = ml_collections.ConfigDict()
    config.data.name = "shapes10"  # embedded offline default; or digits, synthetic, cifar10, mnist
    config.data.data_dir = ""  # TFDS data_dir; "" = TFDS default (~/tensorflow_datasets)
    config.data.eval_split = "test"
    config.data.augment = False  # random crop (pad 4) and horizontal flip
    config.data.image_shape = (32, 32, 3)  # synthetic only
    config.data.num_classes = 10  # synthetic only
    config.data.num_train = 0  # shapes10/digits/synthetic size; 0 = default
    config.data.num_eval = 0

    config.pipeline = ml_collections.ConfigDict()
    # naive, gpipe, 1f1b, interleaved, zb-h1 or zb-v (used when mesh stage > 1)
    config.pipeline.schedule = "gpipe"
    # 0: chosen by timing the model at each count the batch allows (pipeline/microbatches.py),
    # kept in the workdir for resumes.
    config.pipeline.num_microbatches = 1
    # True: the backward recomputes its stage's forward from the stored input. False: the
    # forward stores the backward's residuals (more memory, no recomputation; zb-h1 needs it).
    config.pipeline.remat = True
    config.pipeline.virtual_stages = 1  # model chunks per stage (interleaved only)
    # How layers are cut into stages: "flops" (balance compute), "time" (balance the layers'
    # times measured on this run's devices first, sends included; cached in the workdir),
    # "params" (balance memory), "uniform" (equal layer counts), or a tuple of the K-1 layer
    # indices where stages begin:
    # (4, 8, 12) in a config file, --config.pipeline.split='(4,8,12)' on the command line.
    config.pipeline.split = config_dict.FieldReference("flops", field_type=object)

    config.tensor = ml_collections.ConfigDict()
    # Sharding rules for the tensor axis: logical axis name -> mesh axis. Conv output channels
    # and the first hidden dense layer's features are split (see jaxpar/parallel/tensor.py).
    config.tensor.rules = (("conv_out", "tensor"), ("mlp", "tensor"))

    config.sync = ml_collections.ConfigDict()
    # How data-parallel replicas agree (README "Synchronisation modes"): allreduce (each step),
    # parameter_server, sharded (ZeRO-1), local_sgd (average every sync.period steps), async
    # (stale gradients, delays 0..sync.max_staleness), independent (no communication).
    config.sync.mode = "allreduce"
    config.sync.server = 0  # parameter_server: the data-axis index of the server device
    config.sync.period = 4  # local_sgd: steps between parameter averages
    config.sync.opt_state_at_average = "local"  # local_sgd: keep optimizer state "local"/"average"
    config.sync.max_staleness = 2  # async: largest delay (in updates) of a replica's gradient
    config.sync.staleness_aware_lr = False  # async: divide each gradient's lr by its staleness
    config.sync.impl = "shard_map"  # "shard_map" (jax.shard_map + pmean) or legacy "pmap"
    config.sync.batch_norm = "global"  # "global" (synchronised) or "local" (per replica)
    # Gradients reduced in flat buffers of at most this many bytes, in the backward's order
    # (allreduce, parameter_server, sharded); 0: one collective per parameter, XLA combining
    # them as it will (jaxpar/parallel/buckets.py)
    config.sync.bucket_bytes = 25 * 2**20  # PyTorch DDP's default
    return config
