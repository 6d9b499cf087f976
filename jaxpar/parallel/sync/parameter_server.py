"""`parameter_server`: every worker sends its gradient to one server device (`sync.server`),
which sums them, applies the optimizer and sends the new parameters back.

Communication, per step (P = parameter bytes): N-1 collective-permutes with one pair each,
(worker -> server), carry the gradients in, and N-1 with (server -> worker) carry the
parameters out. The server receives and sends (N-1) x P; each worker sends and receives 1 x P.
That fan-in at one device is what makes a parameter server the bottleneck, where an all-reduce
spreads ~2 x P evenly. (Metrics add two scalar all-reduces; with per-replica BatchNorm the
running averages are averaged too, as under `allreduce`.)

Layout: parameters and optimizer state carry a leading replica axis over the replica axes
(data; node x data counts as one flat group, the server being replica `sync.server` of it). Only the
server's slot of the optimizer state is ever read or written: workers' slots stay zero. (One
SPMD program gives every device the same buffers, so the workers' slots are allocated but
unused; on a real parameter server they would not exist.) The canonical form is the server's
parameters and optimizer state, i.e. the single-device state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxpar.parallel import norms
from jaxpar.parallel.sync.base import SyncRule, block, stack, stacked, unblock


class ParameterServer(SyncRule):
    name = "parameter_server"
    combines = True

    def __init__(self, settings, replicas, tx, variable_specs):
        super().__init__(settings, replicas, tx, variable_specs)
        self.server = int(settings.server)
        self.workers = [i for i in range(self.num_replicas) if i != self.server]

    @classmethod
    def check(cls, config, data):
        if not 0 <= config.sync.server < data:
            return (
                f"sync.server={config.sync.server} is not a device of the data axis (0..{data - 1})"
            )
        return None

    def to_device(self, canonical):
        only_server = lambda x: (
            jnp.zeros((self.num_replicas, *x.shape), x.dtype).at[self.server].set(x)
        )
        return canonical.replace(
            params=stack(canonical.params, self.num_replicas),
            opt_state=jax.tree.map(only_server, canonical.opt_state),
        )

    def canonical(self, state):
        at_server = lambda x: x[self.server]
        return state.replace(
            params=jax.tree.map(at_server, state.params),
            opt_state=jax.tree.map(at_server, state.opt_state),
        )

    def specs(self, shapes):
        specs = super().specs(shapes)
        return specs.replace(
            params=stacked(specs.params, self.replicas),
            opt_state=stacked(specs.opt_state, self.replicas),
        )

    def local_params(self, state):
        return block(state.params)

    def eval_model(self, state):
        return block(state.params), state.batch_stats  # every copy is the server's

    def combine(self, state, grads):
        """Gradients in, one (worker -> server) pair each; their mean is meaningful on the
        server only, and its squared norm goes to every replica (two scalar sums)."""
        r = self.replicas
        specs = self.variable_specs["params"]
        total = grads
        for worker in self.workers:
            received = r.ppermute(grads, [(worker, self.server)], specs)
            total = jax.tree.map(jnp.add, total, received)
        mean = jax.tree.map(lambda g: g / self.num_replicas, total)
        sq = norms.sq_norm(mean, self.variable_specs["params"], self.manual_axes)
        return mean, r.psum(jnp.where(self._is_server(), sq, 0.0))

    def _is_server(self):
        return self.replicas.index() == self.server

    def apply(self, state, combined, stats, noise=None):
        """The server applies the optimizer; parameters out, one (server -> worker) pair
        each."""
        r = self.replicas
        specs = self.variable_specs["params"]
        params, opt_state = block(state.params), block(state.opt_state)

        def serve(p, o, g):
            new = state.replace(params=p, opt_state=o).apply_gradients(self.tx, g, noise)
            return new.params, new.opt_state

        params, opt_state = lax.cond(
            self._is_server(), serve, lambda p, o, g: (p, o), params, opt_state, combined
        )
        out = params
        for worker in self.workers:
            received = r.ppermute(params, [(self.server, worker)], specs)
            is_worker = r.index() == worker
            out = jax.tree.map(lambda o, x, w=is_worker: jnp.where(w, x, o), out, received)
        return state.replace(
            step=state.step + 1,
            params=unblock(out),
            opt_state=unblock(opt_state),
            batch_stats=self.shared_stats(stats),
        )

    def adapted(self, state):
        """The server's adapting-rate state, to every replica (the workers' slots are zero)."""
        found = super().adapted(state)
        if found is None:
            return None
        at_server = lambda x: self.replicas.psum(jnp.where(self._is_server(), block(x), 0))
        return jax.tree.map(at_server, found)
