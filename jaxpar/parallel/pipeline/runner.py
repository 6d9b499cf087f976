"""The pipeline's host side: walk the schedule's events, run chunk programs, move activations.

Every process walks every event of the global order: it runs the programs of chunks whose
stage owns one of its devices and counts the others' (`InFlight.skip`), so that all processes
bound the work in flight at the same points of the program order (dispatch.py). Activations
and their gradients move between stages with `device_put` in one process; across processes
through the mover's collective program (transfer.py), which every process calls in the same
order (a process owning neither side only counts it).

What a backward needs is stored from its forward (the chunk's input, or with remat=False its
residuals); the runner counts those bytes per device and keeps the peak of the last step.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar.parallel.state import add_sums


class Runner:
    def __init__(self, pipe):
        self.pipe = pipe
        self.k, self.num_chunks = pipe.num_stages, pipe.num_chunks
        self.inflight, self.local_stages = pipe.inflight, pipe.local_stages
        self.peak_stash_bytes = [0] * self.k  # per device, measured by the last train step

    # -- dispatching --------------------------------------------------------------------

    def run(self, chunk: int, name: str, *args):
        """Dispatch a program of a chunk of this process's stages, counted in the window."""
        stage = self.pipe.stage_of[chunk]
        return self._dispatched(stage, self.pipe.programs_of[chunk].programs[name](*args))

    def on(self, stage: int, dispatch):
        """`dispatch()` (one computation) where this process owns a device of `stage`, counted
        in the window; elsewhere only counted. Returns its result, or None."""
        if self.local_stages[stage]:
            return self._dispatched(stage, dispatch())
        self.inflight.skip()
        return None

    def _dispatched(self, stage: int, result):
        """`result` counted in the window, and waited for at once where this process holds
        one device of a stage that spans processes: the CPU client runs that program outside
        its order of collectives, so a later move could take every pool thread first while
        the program's collective waits for its other processes (docs/cluster.md, "Why
        dispatch is bounded", 4)."""
        result = self.inflight.add(result)
        return self.inflight.settle(result) if self.pipe.lone_stages[stage] else result

    def send(self, x, src: int, dst: int, chunk: int, rows: int | None):
        """Move chunk `chunk`'s output (or the gradient with respect to it) from stage `src`'s
        devices to stage `dst`'s. Several processes: x is None where this process owns none of
        src's devices, the result None where it owns none of dst's. x is laid out over the
        batch axes only (a tensor-split stage's programs leave it so: ChunkPrograms.boundary),
        so that the move is device to device."""
        pipe = self.pipe
        if not pipe.multi:
            return jax.device_put(x, pipe.batch_sharding[dst])
        if src == dst:  # two chunks on one stage: ZB-V's turn (chunks K-1 and K)
            return x
        shape = pipe.boundary(rows or pipe.microbatch_rows)[chunk]
        return pipe.mover.send(x, src, dst, shape.shape, shape.dtype, pipe.batch_spec)

    def to_all(self, tree, keys: tuple[str, ...]):
        """Metrics or eval sums (scalars named `keys`, replicated on the last chunk's stage)
        on every device, so that every process reads the same values. One process: as is."""
        pipe = self.pipe
        if not pipe.multi:
            return tree
        template = {key: jax.ShapeDtypeStruct((), jax.numpy.float32) for key in keys}
        specs = {key: P() for key in keys}
        return pipe.mover.gather_tree(tree, template, pipe.stage_of[-1], specs)

    # -- the training step ----------------------------------------------------------------

    def train_step(self, chunks, accs, batch):
        """One step over the schedule; returns (chunk states, accumulators, metrics)."""
        pipe, k, c_last, stage_of = self.pipe, self.k, self.num_chunks - 1, self.pipe.stage_of
        st, acc = list(chunks), list(accs)
        stats = [None if x is None else x.batch_stats for x in st]
        step = _Step(self, k)
        rows = batch["image"][0].shape[0] if self.local_stages[stage_of[0]] else None
        for kind, c, m in pipe.order:
            d = stage_of[c]  # the device stage every program of this event runs on
            y = g = None  # the output sent forward, the gradient sent backward
            if not self.local_stages[d]:  # another process's stage: count its program, join sends
                if not (kind == "F" and pipe.remat and c == c_last):  # that one runs nothing
                    self.inflight.skip()
            elif kind == "F":
                y = self._forward(c, m, st[c].replace(batch_stats=stats[c]), stats, batch, step)
            elif kind == "W":
                outs = step.free("kept", (c, m), d)
                acc[c] = self.run(c, "bwd_w", st[c], step.free("stash", (c, m), d), outs, acc[c])
            else:
                g = self._backward(
                    c, m, st[c].replace(batch_stats=stats[c]), stats, acc, batch, step
                )
            if kind == "F" and c < c_last:
                step.sent_f[(c + 1, m)] = self.send(y, d, stage_of[c + 1], c, rows)
            elif kind == "B" and c > 0:
                step.sent_b[(c - 1, m)] = self.send(g, d, stage_of[c - 1], c - 1, rows)
        if pipe.adapt is not None:
            st, acc, extra = self._adapting_update(st, acc, stats)
            return st, acc, self._step_metrics(step, extra)
        parts = [None] * self.num_chunks  # per chunk, its noise-scale scalars (measuring)
        for c in range(self.num_chunks):
            out = self.on(
                stage_of[c],
                lambda c=c: pipe.programs_of[c].programs["update"](
                    st[c].replace(batch_stats=stats[c]), acc[c]
                ),
            )
            st[c], acc[c], *noise = out or (None,) * (2 + pipe.measure)
            parts[c] = noise[0] if noise else None
        return st, acc, self._step_metrics(step, self._noise(parts) if pipe.measure else {})

    def _step_metrics(self, step, extra: dict) -> dict:
        """The step's loss and accuracy (means over the micro-batches, on the last chunk's
        stage, or on every device with several processes) and `extra` beside them."""
        pipe = self.pipe
        self.peak_stash_bytes = step.peak
        metrics = self.on(
            pipe.stage_of[-1],
            lambda: _mean_metrics({"loss": step.losses, "accuracy": step.accuracies}),
        )
        return {**self.to_all(metrics, ("accuracy", "loss")), **extra}

    def _adapting_update(self, st: list, acc: list, stats: list) -> tuple[list, list, dict]:
        """The update under an adapting rate (AdaScale): every chunk combines its replicas'
        gradients and its parts of the squared norms; the parts are added up; every chunk
        applies its combined gradient given the whole model's norms. Returns the states, the
        accumulators, and the step's noise-scale metrics with the rate's gain, progress and
        rate."""
        pipe, stage_of = self.pipe, self.pipe.stage_of
        parts, combined = [None] * self.num_chunks, [None] * self.num_chunks
        for c in range(self.num_chunks):
            out = self.on(
                stage_of[c],
                lambda c=c: pipe.programs_of[c].programs["combine"](
                    st[c].replace(batch_stats=stats[c]), acc[c]
                ),
            )
            combined[c], acc[c], parts[c] = out or (None, None, None)
        noise = self._noise(parts)
        totals = (noise["grad_sq_small"], noise["grad_sq_big"])
        adapted = None
        for c in range(self.num_chunks):
            mine = self._on_stage(totals, stage_of[c])
            out = self.on(
                stage_of[c],
                lambda c=c, mine=mine: pipe.programs_of[c].programs["apply_update"](
                    st[c].replace(batch_stats=stats[c]), combined[c], mine
                ),
            )
            st[c], rate = out or (None, None)
            if c == self.num_chunks - 1:
                adapted = rate
        keys = ("gain", "learning_rate", "progress")
        return st, acc, {**noise, **self.to_all(adapted, keys)}

    def _on_stage(self, scalars, stage: int):
        """Replicated scalars of the last chunk's stage (every device's, with several
        processes) on `stage`'s devices; None where this process owns none of them."""
        pipe = self.pipe
        if not self.local_stages[stage]:
            return None
        target = NamedSharding(pipe.meshes[stage], P())
        if not pipe.multi:
            return jax.device_put(scalars, target)
        devices = set(pipe.meshes[stage].devices.flat)

        def local(x):
            shards = [s.data for s in x.addressable_shards if s.device in devices]
            return jax.make_array_from_single_device_arrays((), target, shards)

        return jax.tree.map(local, scalars)

    def _noise(self, parts: list) -> dict:
        """The step's two squared norms (noise_scale.py): the chunks' parts (each a pair of
        scalars on its stage) added, on the last chunk's stage, or with several processes
        on every device, as the loss is (`to_all`): one scalar gather per stage."""
        pipe, last = self.pipe, self.pipe.stage_of[-1]
        on_stage = []
        for s in range(self.k):
            mine = [p for c, p in enumerate(parts) if pipe.stage_of[c] == s]
            if not mine:
                continue
            total = self.on(s, lambda mine=mine: _sum_pairs(mine))
            if pipe.multi:
                template = (jax.ShapeDtypeStruct((), jax.numpy.float32),) * 2
                total = pipe.mover.gather_tree(total, template, s, (P(), P()))
            else:
                total = jax.device_put(total, NamedSharding(pipe.meshes[last], P()))
            on_stage.append(total)
        small, big = on_stage[0] if len(on_stage) == 1 else _sum_pairs(on_stage)
        return {"grad_sq_small": small, "grad_sq_big": big}

    def _forward(self, c, m, state, stats, batch, step):
        """One F event of chunk c on this process's stage; returns the output to send on."""
        c_last, d = self.num_chunks - 1, self.pipe.stage_of[c]
        x = batch["image"][m] if c == 0 else step.sent_f.pop((c, m))
        if self.pipe.remat:
            step.store("stash", (c, m), x, d)
            if c < c_last:
                y, stats[c] = self.run(c, "fwd", state, x)
                return y
            return None
        target = (batch["label"][m],) if c == c_last else ()
        y, stats[c], res = self.run(c, "fwd_res", state, x, *target)
        step.store("stash", (c, m), res, d)
        if c == c_last:
            step.losses.append(y[0])
            step.accuracies.append(y[1])
        return y

    def _backward(self, c, m, state, stats, acc, batch, step):
        """One B event of chunk c on this process's stage; returns the input gradient to send
        back (None for chunk 0). Updates the accumulators, statistics and stores in place."""
        c_last, d = self.num_chunks - 1, self.pipe.stage_of[c]
        cot = () if c == c_last else (step.sent_b.pop((c, m)),)
        g = None
        if self.pipe.remat:
            x = step.free("stash", (c, m), d)
            target = (batch["label"][m],) if c == c_last else cot
            out = self.run(c, "bwd", state, x, *target, acc[c])
            if c == c_last:
                g, acc[c], stats[c], (loss, correct) = out
                step.losses.append(loss)
                step.accuracies.append(correct)
            elif c > 0:
                g, acc[c] = out
            else:
                acc[c] = out
        elif self.pipe.split_backward:  # B: the input gradient; W runs later from `kept`
            out = self.run(c, "bwd_in", state, step.stores["stash"][(c, m)], *cot)
            g, outs = out if c > 0 else (None, out)
            step.store("kept", (c, m), outs, d)
        else:
            out = self.run(c, "bwd_res", state, step.free("stash", (c, m), d), *cot, acc[c])
            g, acc[c] = out if c > 0 else (None, out)
        return g

    # -- evaluation -----------------------------------------------------------------------

    def eval_step(self, chunks, batch):
        """Loss and correct-prediction sums over one eval batch, micro-batch by micro-batch
        through the chunks."""
        pipe, stage_of, c_last = self.pipe, self.pipe.stage_of, self.num_chunks - 1
        rows = batch["image"][0].shape[0] if self.local_stages[stage_of[0]] else None
        last = stage_of[-1]
        totals = None
        for m in range(pipe.num_microbatches):
            x = batch["image"][m]
            for c in range(c_last):
                y = self.on(stage_of[c], lambda c=c, x=x: self._eval(c, chunks[c], x))
                x = self.send(y, stage_of[c], stage_of[c + 1], c, rows)
            sums = self.on(
                last,
                lambda x=x, m=m: self._eval(
                    c_last, chunks[-1], x, batch["label"][m], batch["mask"][m]
                ),
            )
            if totals is None:
                totals = sums
            else:
                totals = self.on(last, lambda t=totals, s=sums: add_sums(t, s))
        return self.to_all(totals, ("correct", "count", "loss_sum"))

    def _eval(self, c, state, *args):
        return self.pipe.programs_of[c].programs["eval"](state, *args)


class _Step:
    """One step's bookkeeping: values in flight between events and the bytes stored per device."""

    def __init__(self, runner, k: int):
        self.sent_f, self.sent_b = {}, {}
        self.stores = {"stash": {}, "kept": {}}
        self.live, self.peak = [0] * k, [0] * k
        self.losses, self.accuracies = [], []

    def store(self, where: str, key, value, d: int) -> None:
        self.stores[where][key] = value
        self.live[d] += _device_bytes(value)
        self.peak[d] = max(self.peak[d], self.live[d])

    def free(self, where: str, key, d: int):
        value = self.stores[where].pop(key)
        self.live[d] -= _device_bytes(value)
        return value


@jax.jit
def _mean_metrics(metrics: dict[str, list]) -> dict[str, jax.Array]:
    """The step's loss and accuracy: means over the micro-batches, in one computation."""
    return {key: sum(values) / len(values) for key, values in metrics.items()}


@jax.jit
def _sum_pairs(pairs: list) -> tuple:
    """Pairs of scalars added, in one computation."""
    return tuple(sum(values) for values in zip(*pairs))


def _device_bytes(tree) -> int:
    """Bytes one device holds of `tree` (its first shard of every leaf)."""
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))
