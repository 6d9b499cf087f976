"""Data parallelism with jax.shard_map over the batch axes (data, node x data, data x fsdp, ...);
how replicas agree is a pluggable synchronisation rule (`sync.mode`, jaxpar/parallel/sync/).

Every device holds a replica (or, by the rule, a slice) of the state and a 1/d slice of the
global batch. The step body is the same for every rule: the replica's gradient at
`rule.local_params` (per-device values, so that under the default `allreduce` rule
`average_gradients` is exactly one all-reduce of the parameter bytes), then `rule.update`.
(Without the per-device cast, shard_map's check_vma would already sum the gradient of a
replicated parameter over the replica axes, and a pmean on top would return d times the true
gradient.) Parameters an axis shards (fsdp) are gathered layer by layer inside the model
(`variables.gather_fn`), and their gradients arrive reduce-scattered.

TensorParallel (tensor_parallel.py) is this strategy with the other axes left to the sharding
rules; it overrides the few hooks marked below.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental.layout import Format, Layout
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import axes
from jaxpar import mesh as mesh_lib
from jaxpar.parallel import norms, sync, tensor, variables
from jaxpar.parallel.adapt import adapted_metrics, adapting_noise
from jaxpar.parallel.buckets import Buckets
from jaxpar.parallel.replicas import Replicas
from jaxpar.parallel.state import eval_sums, measured_loss_and_grads, state_shapes
from jaxpar.parallel.strategy import Program, Strategy
from jaxpar.parallel.sync.base import manual
from jaxpar.run_spec import DEFAULTS

_shapes = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def in_formats(tree, formats):
    """`tree`'s arrays moved into `formats` (layout and sharding) where they are not in them
    already; an array in its format is passed through, not copied."""
    move = lambda x, f: x if getattr(x, "format", None) == f else jax.device_put(x, f)
    return jax.tree.map(move, tree, formats)


def _compiler_layouts(shardings):
    """`shardings` with each array's layout in memory left to XLA (`Layout.AUTO`), for the
    donated state. XLA then keeps each parameter in the layout its update writes: on a GPU, a
    convolution's weight and momentum in the filter layout cuDNN's weight gradient arrives in,
    so the update writes the donated buffer in place instead of into a copy. A state in another
    layout (the first step's, a restored checkpoint's) is converted when it is passed in. The
    CPU's compiler keeps the default layouts in most programs, not in all (`sync.mode=sharded`
    moves a convolution's kernel)."""
    return jax.tree.map(lambda s: Format(Layout.AUTO, s), shardings)


class DataParallel(Strategy):
    """shard_map over the batch axes with the config's sync rule."""

    name = "data"
    auto_axes = False  # hook: leave the axes other than the batch axes to the sharding rules

    impl = "shard_map"  # the sync.impl this strategy is
    accumulates = True

    @classmethod
    def check(cls, config, shape):
        if config.sync.impl != cls.impl:
            return (
                f"strategy={cls.name} runs with sync.impl={cls.impl}, not "
                f"{config.sync.impl}; change one of them (strategy=auto follows sync.impl)"
            )
        other = [a for a, n in shape.items() if n > 1 and a not in axes.batch_axes(shape)]
        if other:
            names, n = tuple(shape), math.prod(shape.values())
            first = axes.batch_axes(shape)[0] if axes.batch_axes(shape) else names[0]
            sizes = [
                shape[a] * math.prod(shape[o] for o in other)
                if a == first
                else 1
                if a in other
                else shape[a]
                for a in names
            ]
            return (
                f"strategy={cls.name} splits the batch only, but the mesh "
                f"{axes.spelled(shape)} has {'/'.join(other)} > 1; use "
                f"--config.mesh_shape={mesh_lib.spelled_shape(names, sizes)} (all {n} "
                "devices on the batch) or strategy=auto"
            )
        return None

    @classmethod
    def check_model(cls, config, shape, model):
        accum = config.get("grad_accum_steps", DEFAULTS.grad_accum_steps)
        if accum > 1 and any(layer.names.get("batch_stats") for layer in model.layers):
            return (
                f"grad_accum_steps={accum} would compute BatchNorm statistics per slice "
                f"of the batch, which changes the model {model.name} trains; use "
                "grad_accum_steps=1 (or a model without BatchNorm)"
            )
        return None

    def __init__(self, config, model, mesh, tx):
        super().__init__(config, model, mesh, tx)
        self.replicas = self.make_replicas(dict(mesh.shape))
        self.batch_spec = self.replicas.spec
        self.batch_sharding = NamedSharding(mesh, self.batch_spec)
        self.rule = sync.build(self.sync, self.replicas, tx, self.variable_specs())
        self.gather = variables.gather_fn(self.rule.variable_specs["params"], dict(mesh.shape))
        if self.sync.mode != "allreduce":
            self.name = f"{self.name} ({self.sync.mode})"
        shared = state_shapes(model, tx)
        self.accum = config.get("grad_accum_steps", DEFAULTS.grad_accum_steps)
        self._canonical_shapes = jax.eval_shape(self.rule.from_shared, shared)
        device_shapes = jax.eval_shape(self.rule.to_device, self._canonical_shapes)
        self.state_specs = self.rule.specs(device_shapes)
        self.state_sharding = mesh_lib.shardings(mesh, self.state_specs)
        self._device_shapes = device_shapes
        self._to_canonical = jax.jit(self.rule.canonical)
        self._replica_mean = jax.jit(lambda m: jax.tree.map(jnp.mean, m))
        self._train = self._eval = None
        self._stepped = None  # the state the last step returned, in the step's layouts
        self._step: Program | None = None  # the compiled train step, with its arguments

    # -- hooks TensorParallel overrides ------------------------------------------------------

    def make_replicas(self, shape: dict[str, int]) -> Replicas:
        return Replicas(shape, Buckets.of(self.sync, self.model))

    def variable_specs(self) -> dict:
        """Specs of the variables over the mesh: by the sharding rules over the rules axes
        (none here) and by the parameter-sharding axes (fsdp); variables.py."""
        return variables.specs(self.model, tensor.rules_from(self.config), dict(self.mesh.shape))

    constrain = None  # activations' layout inside the step (model.apply's `constrain`)

    def grads_in_layout(self, grads):
        """Gradients pinned to their parameters' layout before the update (tensor only)."""
        return grads

    # -- state ------------------------------------------------------------------------------

    def canonical_shapes(self):
        return self._canonical_shapes

    def state_shapes(self):
        return jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            self._device_shapes,
            self.state_sharding,
        )

    def place(self, host_state):
        host_state = self.rule.fit(host_state, self._canonical_shapes)
        if self.rule.identity_layout:  # a transfer, no program
            return mesh_lib.put(host_state, self.state_sharding)
        return jax.jit(self.rule.to_device, out_shardings=self.state_sharding)(host_state)

    def canonical(self, state):
        return self._to_canonical(state)

    # -- batches ----------------------------------------------------------------------------

    def put_batch(self, local_batch):
        return {
            k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in local_batch.items()
        }

    def batch_shapes(self, batch_size, eval=False):
        image = (batch_size, *self.model.input_shape)
        out = {
            "image": jax.ShapeDtypeStruct(image, jnp.float32, sharding=self.batch_sharding),
            "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=self.batch_sharding),
        }
        if eval:
            out["mask"] = jax.ShapeDtypeStruct(
                (batch_size,), jnp.float32, sharding=self.batch_sharding
            )
        elif self.model.stochastic:
            out["example"] = jax.ShapeDtypeStruct(
                (batch_size,), jnp.uint32, sharding=self.batch_sharding
            )
        return out

    # -- the step ---------------------------------------------------------------------------

    def noise_groups(self) -> int | str:
        """The replicas times the accumulation slices: each slice of each replica is a small
        batch (slices of replica 0 first, in row order), under a rule that combines the
        replicas' gradients every step. Under fsdp each layer's backward squares the
        replica's own gradient of its sharded parameters before they are summed over the
        replicas (state.measured_loss_and_grads' `probe`)."""
        reason = norms.why_not_measured(
            self.measures_noise, self.sync, self.model, self.rule.combines, self.replicas.count
        )
        if reason:
            return reason
        groups = self.replicas.count * self.accum
        if groups == 1:
            return (
                "one replica and one slice give one gradient size; set "
                "--config.grad_accum_steps=2 (or more) to measure the noise scale"
            )
        return groups

    def _train_body(self, state, batch):
        rule = self.rule
        groups = self.noise_groups()
        measure = isinstance(groups, int)
        loss, stats, accuracy, grads, small = measured_loss_and_grads(
            self.model,
            rule.local_params(state),
            rule.local_stats(state.batch_stats),
            batch,
            bn_axis_name=rule.bn_axis_name,
            constrain=self.constrain,
            chunks=self.accum,
            gather=self.gather,
            slice_sq=norms.local_sq if measure else None,
            probe=self.probe() if measure and self.gather is not None else None,
        )
        small = self.replicas.pmean(small) if measure else None
        noise = adapting_noise(self.rate, small, groups)
        state, big = rule.update_measured(state, self.grads_in_layout(grads), stats, noise)
        metrics = rule.metrics(loss, accuracy)
        if measure:  # the two squared norms of the noise scale (noise_scale.py)
            metrics.update(grad_sq_small=small, grad_sq_big=big)
        if noise is not None:
            metrics.update(adapted_metrics(rule.adapted(state)))
        return state, metrics

    def probe(self):
        """fsdp's zero scalar whose gradient is a replica's squared norm of its sharded
        parameters' gradient (variables.Gathered.probed), per replica."""
        return self.replicas.varying(jnp.zeros((), jnp.float32))

    def _sm(self, fn, in_specs, out_specs):
        return self.replicas.shard_map(fn, self.mesh, in_specs, out_specs, self.auto_axes)

    def _jit_train(self):
        specs = manual(self.state_specs, self.replicas)
        metric_spec = self.batch_spec if self.rule.per_replica_metrics else P()
        step = self._sm(self._train_body, (specs, self.batch_spec), (specs, metric_spec))
        state = _compiler_layouts(self.state_sharding)
        return jax.jit(
            step, donate_argnums=0, in_shardings=(state, None), out_shardings=(state, None)
        )

    def _lower(self, state, batch):
        """The train step lowered for these abstract arguments (ShapeDtypeStructs: a concrete
        array's own layout would contradict `Layout.AUTO`)."""
        with jax.set_mesh(self.mesh):  # sharding constraints inside resolve against the mesh
            return self._jit_train().lower(state, batch)

    def _compile(self, state, batch):
        args = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), (state, batch)
        )
        lowered = self._lower(*args)  # abstract: XLA chooses the state's layouts
        self._train = lowered.compile()
        self._step = Program("step", "train step", 0, 0, self.mesh, 1, args, lowered, self._train)

    def train_step(self, state, batch):
        if self._train is None:
            self.compile(state, batch)
        if state is not self._stepped:  # placed or restored: into the layouts XLA chose
            state = in_formats(state, self._train.input_formats[0][0])
        state, metrics = self._train(state, batch)
        self._stepped = state
        if self.rule.per_replica_metrics:  # [replicas] values: averaged outside the step
            metrics = self._replica_mean(metrics)
        return state, metrics

    def programs(self, batch_shapes):
        if self._step is not None and _same_shapes(self._step.args[1], batch_shapes):
            return [self._step]  # the program the steps run, traced and compiled once
        args = (self.state_shapes(), batch_shapes)
        return [Program("step", "train step", 0, 0, self.mesh, 1, args, self._lower(*args))]

    # -- evaluation -------------------------------------------------------------------------

    def _eval_body(self, state, batch):
        params, stats = self.rule.eval_model(state)
        if self.rule.eval_kind == "each":  # independent: every replica evaluates every image
            batch = jax.tree.map(lambda x: self.replicas.all_gather(x, 0), batch)
            return jax.tree.map(lambda x: x[None], eval_sums(self.model, params, stats, batch))
        return self.replicas.psum(
            eval_sums(self.model, params, stats, batch, self.constrain, self.gather)
        )

    def jit_eval(self):
        """The eval program, jitted (eval_step runs it; lowered, its text is what an eval
        batch runs)."""
        each = self.rule.eval_kind == "each"
        fn = self._sm(
            self._eval_body,
            (manual(self.state_specs, self.replicas), self.batch_spec),
            self.batch_spec if each else P(),
        )

        @jax.jit  # one computation (dispatch.py counts computations)
        def evaluate(state, batch):
            sums = fn(state, batch)
            if not each:
                return sums
            return {**{k: v[0] for k, v in sums.items()}, "replica_correct": sums["correct"]}

        return evaluate

    def eval_step(self, state, batch):
        if self._eval is None:
            self._eval = self.jit_eval()
        with jax.set_mesh(self.mesh):
            return self.inflight.add(self._eval(state, batch))


def _same_shapes(a, b) -> bool:
    """Whether two trees of arrays or ShapeDtypeStructs have the same shapes and dtypes."""
    shape = lambda t: jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), t)
    return jax.tree.structure(a) == jax.tree.structure(b) and shape(a) == shape(b)
