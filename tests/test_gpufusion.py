"""The GPU program modelled from a CPU-compiled one (jaxpar/predict/gpufusion.py): each rule
pinned on a small hand-written program, where kernels and bytes can be counted by hand."""

from __future__ import annotations

import pytest

from jaxpar.predict import gpufusion, opclass

# A bfloat16 convolution as XLA:CPU compiles it: the activation converted to float32 for the
# convolution (rule 1 absorbs the convert), the weight converted once (a parameter: stays a
# kernel), a float32 result (rule 4: bfloat16 on the GPU), then a chain of three elementwise
# kernels (rule 2 fuses them into one), an iota with no operands (rule 3) feeding a window's
# integer indices (rule 3: free), and the root tuple.
PROGRAM = """HloModule m, is_scheduled=true

%cvt_x (p: bf16[8,32,32,64]) -> f32[8,32,32,64] {
  %p = bf16[8,32,32,64]{3,2,1,0} parameter(0)
  ROOT %c = f32[8,32,32,64]{3,2,1,0} convert(%p)
}

%cvt_w (p: f32[3,3,64,64]) -> bf16[3,3,64,64] {
  %p = f32[3,3,64,64]{3,2,1,0} parameter(0)
  ROOT %c = bf16[3,3,64,64]{3,2,1,0} convert(%p)
}

%conv (a: f32[8,32,32,64], b: bf16[3,3,64,64]) -> f32[8,32,32,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %b = bf16[3,3,64,64]{3,2,1,0} parameter(1)
  %bc = f32[3,3,64,64]{3,2,1,0} convert(%b)
  ROOT %y = f32[8,32,32,64]{3,2,1,0} convolution(%a, %bc), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}

%mul (a: f32[8,32,32,64]) -> f32[8,32,32,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  ROOT %m = f32[8,32,32,64]{3,2,1,0} multiply(%a, %a)
}

%relu (a: f32[8,32,32,64]) -> f32[8,32,32,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %z = f32[] constant(0)
  %zb = f32[8,32,32,64]{3,2,1,0} broadcast(%z), dimensions={}
  ROOT %r = f32[8,32,32,64]{3,2,1,0} maximum(%a, %zb)
}

%down (a: f32[8,32,32,64], i: s32[8,32,32,64]) -> bf16[8,32,32,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %i = s32[8,32,32,64]{3,2,1,0} parameter(1)
  %f = f32[8,32,32,64]{3,2,1,0} convert(%i)
  %s = f32[8,32,32,64]{3,2,1,0} add(%a, %f)
  ROOT %d = bf16[8,32,32,64]{3,2,1,0} convert(%s)
}

%make_iota () -> s32[8,32,32,64] {
  ROOT %io = s32[8,32,32,64]{3,2,1,0} iota(), iota_dimension=3
}

ENTRY %main (x: bf16[8,32,32,64], w: f32[3,3,64,64]) -> (bf16[8,32,32,64], bf16[3,3,64,64]) {
  %x = bf16[8,32,32,64]{3,2,1,0} parameter(0)
  %w = f32[3,3,64,64]{3,2,1,0} parameter(1)
  %cx = f32[8,32,32,64]{3,2,1,0} fusion(%x), kind=kLoop, calls=%cvt_x
  %cw = bf16[3,3,64,64]{3,2,1,0} fusion(%w), kind=kLoop, calls=%cvt_w
  %y = f32[8,32,32,64]{3,2,1,0} fusion(%cx, %cw), kind=kCustom, calls=%conv
  %m = f32[8,32,32,64]{3,2,1,0} fusion(%y), kind=kLoop, calls=%mul
  %r = f32[8,32,32,64]{3,2,1,0} fusion(%m), kind=kLoop, calls=%relu
  %io = s32[8,32,32,64]{3,2,1,0} fusion(), kind=kLoop, calls=%make_iota
  %d = bf16[8,32,32,64]{3,2,1,0} fusion(%r, %io), kind=kLoop, calls=%down
  ROOT %t = (bf16[8,32,32,64]{3,2,1,0}, bf16[3,3,64,64]{3,2,1,0}) tuple(%d, %cw)
}
"""

ACT = 8 * 32 * 32 * 64  # elements of one activation
W = 3 * 3 * 64 * 64  # elements of the weight


def test_each_rule_on_a_small_program():
    cpu = opclass.classify(PROGRAM)
    gpu = gpufusion.analyse(PROGRAM, "bfloat16")
    # the CPU runs 7 kernels: two converts, the convolution, three elementwise, the iota
    assert cpu.kernels == 7
    # the GPU: the weight's convert, the convolution, one fused elementwise kernel
    assert gpu.ops.kernels == 3
    assert gpu.ops.flops == cpu.flops == 2 * ACT * 9 * 64
    # the convolution reads x (bf16, not its float32 copy) and the bf16 weight, writes bf16
    ((flops, moved, winograd, narrow, thin, tile, keys),) = gpu.ops.matmuls
    assert narrow == 64 and not thin  # 64 output features, 576 products each, 8192 output rows
    assert tile == 64  # 64 input and 64 output features, 8192 rows
    assert keys[0][-1] == "forward" and keys[0][3:7] == (
        64,
        64,
        3,
        3,
    )  # its layer, as a table names it
    assert flops == cpu.flops
    assert winograd and moved == 2 * ACT + 2 * W + 2 * ACT
    # the weight's convert reads float32 and writes bfloat16; the fused kernel reads the
    # convolution's result and writes the output, both bfloat16 on the GPU; the indices cost 0
    assert gpu.ops.memory_bytes == (4 * W + 2 * W) + (2 * ACT + 2 * ACT)
    # live at once at most: the weight's bfloat16 copy (an output), the convolution's result
    # and the fused kernel's output
    assert gpu.temp_bytes == 2 * W + 2 * ACT + 2 * ACT
    assert gpu.state_bytes == 2 * ACT + 4 * W


def test_float32_keeps_its_bytes_and_a_shared_producer_is_duplicated():
    """In float32 nothing is halved; an elementwise kernel read by two elementwise kernels is
    computed inside both (one big input: no more traffic), so it launches no kernel."""
    text = PROGRAM.replace("%d = bf16[8,32,32,64]{3,2,1,0} fusion(%r, %io)",
                           "%d = bf16[8,32,32,64]{3,2,1,0} fusion(%m, %io)")  # fmt: skip
    text = text.replace("tuple(%d, %cw)", "tuple(%d, %cw, %r)").replace(
        "-> (bf16[8,32,32,64], bf16[3,3,64,64])",
        "-> (bf16[8,32,32,64], bf16[3,3,64,64], f32[8,32,32,64])",
    )
    gpu = gpufusion.analyse(text, "float32")
    # %m feeds %r (an output) and %d: inlined into both; %r and %d stay two kernels
    assert gpu.ops.kernels == 4  # weight convert, convolution, %r, %d
    # each of %r and %d reads the convolution's float32 result itself
    assert gpu.ops.memory_bytes == pytest.approx((4 * W + 2 * W) + 2 * (4 * ACT) + 4 * ACT
                                                 + 2 * ACT)  # fmt: skip


# A residual block's end as XLA:CPU leaves it in a bfloat16 step: the pre-ReLU sum of the
# convolution's (scaled) result and the block's input, stored, then read by the ReLU and by
# its backward (a select on the sum's sign). %sc is a per-channel scale both read.
RESIDUAL = """HloModule m, is_scheduled=true

%conv (a: f32[8,32,32,64], b: f32[3,3,64,64]) -> f32[8,32,32,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %b = f32[3,3,64,64]{3,2,1,0} parameter(1)
  ROOT %y = f32[8,32,32,64]{3,2,1,0} convolution(%a, %b), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}

%scale (s: f32[64]) -> f32[64] {
  %s = f32[64]{0} parameter(0)
  ROOT %d = f32[64]{0} add(%s, %s)
}

%sum (y: f32[8,32,32,64], x: f32[8,32,32,64], sc: f32[64]) -> f32[8,32,32,64] {
  %y = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %x = f32[8,32,32,64]{3,2,1,0} parameter(1)
  %sc = f32[64]{0} parameter(2)
  %b = f32[8,32,32,64]{3,2,1,0} broadcast(%sc), dimensions={3}
  %m = f32[8,32,32,64]{3,2,1,0} multiply(%y, %b)
  ROOT %a = f32[8,32,32,64]{3,2,1,0} add(%m, %x)
}

%relu (a: f32[8,32,32,64]) -> f32[8,32,32,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %z = f32[] constant(0)
  %zb = f32[8,32,32,64]{3,2,1,0} broadcast(%z), dimensions={}
  ROOT %r = f32[8,32,32,64]{3,2,1,0} maximum(%a, %zb)
}

%back (a: f32[8,32,32,64], g: f32[8,32,32,64], sc: f32[64]) -> f32[8,32,32,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %g = f32[8,32,32,64]{3,2,1,0} parameter(1)
  %sc = f32[64]{0} parameter(2)
  %z = f32[] constant(0)
  %zb = f32[8,32,32,64]{3,2,1,0} broadcast(%z), dimensions={}
  %p = pred[8,32,32,64]{3,2,1,0} compare(%a, %zb), direction=GT
  %s = f32[8,32,32,64]{3,2,1,0} select(%p, %g, %zb)
  %b = f32[8,32,32,64]{3,2,1,0} broadcast(%sc), dimensions={3}
  ROOT %o = f32[8,32,32,64]{3,2,1,0} multiply(%s, %b)
}

ENTRY %main (x: f32[8,32,32,64], w: f32[3,3,64,64], g: f32[8,32,32,64], s: f32[64]) -> (f32[8,32,32,64], f32[8,32,32,64]) {
  %x = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %w = f32[3,3,64,64]{3,2,1,0} parameter(1)
  %g = f32[8,32,32,64]{3,2,1,0} parameter(2)
  %s = f32[64]{0} parameter(3)
  %y = f32[8,32,32,64]{3,2,1,0} fusion(%x, %w), kind=kCustom, calls=%conv
  %sc = f32[64]{0} fusion(%s), kind=kLoop, calls=%scale
  %a = f32[8,32,32,64]{3,2,1,0} fusion(%y, %x, %sc), kind=kLoop, calls=%sum
  %r = f32[8,32,32,64]{3,2,1,0} fusion(%a), kind=kLoop, calls=%relu
  %o = f32[8,32,32,64]{3,2,1,0} fusion(%a, %g, %sc), kind=kLoop, calls=%back
  ROOT %t = (f32[8,32,32,64]{3,2,1,0}, f32[8,32,32,64]{3,2,1,0}) tuple(%r, %o)
}
"""


def test_a_producer_is_computed_inside_its_users_where_that_moves_fewer_bytes():
    """XLA:GPU's priority fusion fuses a producer into all its users where that is cheaper
    than writing it once and reading it in each: users x its reads <= its reads + its write
    + users x its write. The pre-ReLU sum (two activations read, two users) is computed in the
    ReLU and in its backward, so it is neither a kernel nor a stored buffer (a per-channel
    scale read by both, inlined itself, does not stop it); with a third input and a third
    user it would cost more bytes and stays a kernel."""
    gpu = gpufusion.analyse(RESIDUAL, "float32")
    f32 = 4 * ACT
    assert gpu.ops.kernels == 3  # the convolution, the ReLU, its backward
    # the ReLU reads y and x; the backward y, x and g; each writes its output (+ the scale)
    assert gpu.ops.memory_bytes == (3 * f32 + 4 * 64) + (4 * f32 + 4 * 64)
    assert gpu.temp_bytes == 3 * f32  # y, and the two outputs: no stored sum

    wider = (RESIDUAL.replace("(y: f32[8,32,32,64], x: f32[8,32,32,64], sc: f32[64])",
                              "(y: f32[8,32,32,64], x: f32[8,32,32,64], sc: f32[64], "
                              "v: f32[8,32,32,64])")
             .replace("ROOT %a = f32[8,32,32,64]{3,2,1,0} add(%m, %x)",
                      "%v = f32[8,32,32,64]{3,2,1,0} parameter(3)\n"
                      "  %ax = f32[8,32,32,64]{3,2,1,0} add(%m, %x)\n"
                      "  ROOT %a = f32[8,32,32,64]{3,2,1,0} add(%ax, %v)")
             .replace("fusion(%y, %x, %sc), kind=kLoop, calls=%sum",
                      "fusion(%y, %x, %sc, %g), kind=kLoop, calls=%sum")
             .replace("%o = f32[8,32,32,64]{3,2,1,0} fusion(%a, %g, %sc), kind=kLoop, calls=%back",
                      "%o = f32[8,32,32,64]{3,2,1,0} fusion(%a, %g, %sc), kind=kLoop, calls=%back\n"
                      "  %q = f32[8,32,32,64]{3,2,1,0} fusion(%a), kind=kLoop, calls=%relu")
             .replace("tuple(%r, %o)", "tuple(%r, %o, %q)")
             .replace("-> (f32[8,32,32,64], f32[8,32,32,64]) {",
                      "-> (f32[8,32,32,64], f32[8,32,32,64], f32[8,32,32,64]) {"))  # fmt: skip
    gpu = gpufusion.analyse(wider, "float32")
    # three activations read by a sum three kernels read: computing it in each would read
    # 9 activations where storing it moves 3 + 1 + 3
    assert gpu.ops.kernels == 5  # the convolution, the sum, the two ReLUs, the backward
    assert gpu.temp_bytes == 4 * f32  # the stored sum and the three outputs (y read once)


def test_an_image_s_first_layer_is_thin_and_priced_at_its_own_rate():  # and matmul_kernel_s
    """The convolution over an image's 3 channels and its weight gradient are `thin` (the
    image gets no gradient); the next layer's are not (its weight and input gradients; a
    sum's gradient needs not its forward). A GPU profile with
    a thin_efficiency prices a thin kernel's FLOPs at that fraction of peak, and one without
    prices it as any other."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from jaxpar.predict import hardware

    def loss(ws, x):
        for w in ws:
            x = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))  # fmt: skip
        return jnp.sum(x)

    ws = (jnp.ones((7, 7, 3, 16)), jnp.ones((3, 3, 16, 16)))
    text = jax.jit(jax.grad(loss)).lower(ws, jnp.ones((8, 16, 16, 3))).compile().as_text()
    ops = gpufusion.analyse(text).ops
    thin = [m for m in ops.matmuls if m.thin]
    assert len(ops.matmuls) == 4 and len(thin) == 2  # first layer: forward + weight gradient
    assert all(m.flops == 2 * 8 * 16 * 16 * 16 * 7 * 7 * 3 for m in thin)
    gpu = hardware.Profile("g", 1, 1, {"float32": 1e12}, 1e9, hardware.Link(1e9, 0),
                           hardware.Link(1e9, 0), compute_efficiency=0.5,
                           memory_bandwidth=1e15, compiler="gpu")  # fmt: skip
    slow = dataclasses.replace(gpu, thin_efficiency=0.05)
    extra = sum(m.flops for m in thin) * (1 / (1e12 * 0.05) - 1 / (1e12 * 0.5))
    assert slow.device_time(ops, "float32") - gpu.device_time(ops, "float32") == pytest.approx(
        extra
    )


# XLA:CPU's float32 weight gradient: the same elementwise result computed twice from the same
# inputs, once transposed for the convolution that reads only it (rule 6: one kernel on a GPU)
TWINS = """HloModule m, is_scheduled=true

%scale (a: f32[8,32,32,64], s: f32[64]) -> f32[8,32,32,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %s = f32[64]{0} parameter(1)
  %sb = f32[8,32,32,64]{3,2,1,0} broadcast(%s), dimensions={3}
  ROOT %m = f32[8,32,32,64]{3,2,1,0} multiply(%a, %sb)
}

%scale_t (a: f32[8,32,32,64], s: f32[64]) -> f32[64,32,32,8] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %s = f32[64]{0} parameter(1)
  %sb = f32[8,32,32,64]{3,2,1,0} broadcast(%s), dimensions={3}
  %m = f32[8,32,32,64]{3,2,1,0} multiply(%a, %sb)
  ROOT %t = f32[64,32,32,8]{3,2,1,0} transpose(%m), dimensions={3,1,2,0}
}

%wgrad (a: f32[64,32,32,8], g: f32[8,32,32,64]) -> f32[3,3,64,64] {
  %a = f32[64,32,32,8]{3,2,1,0} parameter(0)
  %g = f32[8,32,32,64]{3,2,1,0} parameter(1)
  ROOT %w = f32[3,3,64,64]{3,2,1,0} convolution(%a, %g), window={size=32x32 pad=1_1x1_1}, dim_labels=f01b_i01o->01bf
}

ENTRY %main (x: f32[8,32,32,64], s: f32[64], dy: f32[8,32,32,64]) -> (f32[8,32,32,64], f32[3,3,64,64]) {
  %x = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %s = f32[64]{0} parameter(1)
  %dy = f32[8,32,32,64]{3,2,1,0} parameter(2)
  %y = f32[8,32,32,64]{3,2,1,0} fusion(%x, %s), kind=kLoop, calls=%scale
  %yt = f32[64,32,32,8]{3,2,1,0} fusion(%x, %s), kind=kLoop, calls=%scale_t
  %dw = f32[3,3,64,64]{3,2,1,0} fusion(%yt, %dy), kind=kCustom, calls=%wgrad
  ROOT %out = (f32[8,32,32,64]{3,2,1,0}, f32[3,3,64,64]{3,2,1,0}) tuple(%y, %dw)
}
"""


def test_a_transposed_twin_for_a_weight_gradient_is_not_made():
    """Rule 6: the transposed copy of %y is not a kernel; the weight gradient reads %y."""
    cpu, gpu = opclass.classify(TWINS), gpufusion.analyse(TWINS, "float32")
    assert cpu.kernels == 3 and gpu.ops.kernels == 2  # %y and the convolution
    assert gpu.ops.memory_bytes == 4 * ACT + 4 * 64 + 4 * ACT  # %y reads x and s, writes y
    ((_, moved, *_),) = gpu.ops.matmuls
    assert moved == 4 * ACT + 4 * ACT + 4 * W  # y (not its transposed twin), dy, the result


# A BatchNorm-like forward over an activation, then a 3x3 max-pool, as XLA:CPU compiles them:
# the per-channel mean and the variance about it (reductions of the activation), the centred
# activation (reads x and the mean), and the pooling window.
STATS = """HloModule m, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] maximum(%a, %b)
}

%mean (a: f32[8,32,32,64]) -> f32[64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%a, %z), dimensions={0,1,2}, to_apply=%add
}

%centre (a: f32[8,32,32,64], m: f32[64]) -> f32[8,32,32,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %m = f32[64]{0} parameter(1)
  %mb = f32[8,32,32,64]{3,2,1,0} broadcast(%m), dimensions={3}
  ROOT %c = f32[8,32,32,64]{3,2,1,0} subtract(%a, %mb)
}

%var (a: f32[8,32,32,64], m: f32[64]) -> f32[64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %m = f32[64]{0} parameter(1)
  %mb = f32[8,32,32,64]{3,2,1,0} broadcast(%m), dimensions={3}
  %c = f32[8,32,32,64]{3,2,1,0} subtract(%a, %mb)
  %q = f32[8,32,32,64]{3,2,1,0} multiply(%c, %c)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%q, %z), dimensions={0,1,2}, to_apply=%add
}

%pool (a: f32[8,32,32,64]) -> f32[8,16,16,64] {
  %a = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %z = f32[] constant(-inf)
  ROOT %p = f32[8,16,16,64]{3,2,1,0} reduce-window(%a, %z), window={size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0}, to_apply=%max
}

ENTRY %main (x: f32[8,32,32,64]) -> (f32[8,16,16,64], f32[64]) {
  %x = f32[8,32,32,64]{3,2,1,0} parameter(0)
  %m = f32[64]{0} fusion(%x), kind=kInput, calls=%mean
  %v = f32[64]{0} fusion(%x, %m), kind=kInput, calls=%var
  %c = f32[8,32,32,64]{3,2,1,0} fusion(%x, %m), kind=kLoop, calls=%centre
  %p = f32[8,16,16,64]{3,2,1,0} fusion(%c), kind=kLoop, calls=%pool
  ROOT %out = (f32[8,16,16,64]{3,2,1,0}, f32[64]{0}) tuple(%p, %v)
}
"""


def test_kernel_classes_and_a_split_reduction():
    """Rule 7: a long reduction is two kernels (XLA:GPU splits it: partial sums, then a small
    final one). Rule 8: each memory-bound kernel's class, as the
    GPU's program names it: a weight's convert that only matrix kernels read is a transpose
    (XLA:GPU lays the filter out for cuDNN in that kernel), the fused chain is elementwise, the
    max-pool a window."""
    # PROGRAM's weight convert is also an output of the program, so it stays elementwise
    program = gpufusion.analyse(PROGRAM, "bfloat16").ops
    assert program.memory_classes == (("elementwise", 6.0 * W + 4.0 * ACT, 2),)
    alone = PROGRAM.replace("tuple(%d, %cw)", "tuple(%d)").replace(
        "-> (bf16[8,32,32,64], bf16[3,3,64,64])", "-> (bf16[8,32,32,64])"
    )
    program = gpufusion.analyse(alone, "bfloat16").ops
    assert program.memory_classes == (("elementwise", 4.0 * ACT, 1), ("transpose", 6.0 * W, 1))
    ops = gpufusion.analyse(STATS, "float32").ops
    # the mean reads x (4 B an element) and writes 64 floats, the variance reads x and the
    # mean: two kernels each, the second summing 91 partials (8,192 elements each: 91^2 >=
    # 8,192) into each of the 64 results; the centred copy is fused into the pool (its only
    # reader): x and the mean in, the pooled quarter out
    final = 4 * 64 * (91 + 1)  # the partials read, the results written
    assert ops.memory_classes == (("reduce", 2 * 4.0 * ACT + 3 * 4 * 64 + 2 * final, 4),
                                  ("window", 4.0 * ACT + 4 * 64 + ACT, 1))  # fmt: skip
    assert ops.kernels == 5 and ops.memory_bytes == sum(b for _, b, _ in ops.memory_classes)


LENGTHS = """HloModule m, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%wide (x: f32[64,8,8,512]) -> f32[512] {
  %x = f32[64,8,8,512]{3,2,1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[512]{0} reduce(%x, %z), dimensions={0,1,2}, to_apply=%add
}

%long (y: f32[2,64,64,8]) -> f32[8] {
  %y = f32[2,64,64,8]{3,2,1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[8]{0} reduce(%y, %z), dimensions={0,1,2}, to_apply=%add
}

ENTRY %main (x: f32[64,8,8,512], y: f32[2,64,64,8]) -> (f32[512], f32[8]) {
  %x = f32[64,8,8,512]{3,2,1,0} parameter(0)
  %y = f32[2,64,64,8]{3,2,1,0} parameter(1)
  %a = f32[512]{0} fusion(%x), kind=kInput, calls=%wide
  %b = f32[8]{0} fusion(%y), kind=kInput, calls=%long
  ROOT %out = (f32[512]{0}, f32[8]{0}) tuple(%a, %b)
}
"""


def test_a_reduction_is_split_by_what_each_result_sums():
    """Rule 7 counts by the reduction's length, not its size: XLA:GPU's programs sum up to
    4,096 elements into each result in one kernel (a 4x4 or 8x8 map's BatchNorm statistics
    over the batch: 2,048 and 4,096 whole in VGG19's, DenseNet's and Inception's programs) and
    split longer ones (6,272 in ResNet-50's on). Here 2M elements into 512 results (4,096 each)
    are one kernel, 65,536 into 8 (8,192 each) two."""
    only_a = LENGTHS.replace("tuple(%a, %b)", "tuple(%a)").replace(
        "  %b = f32[8]{0} fusion(%y), kind=kInput, calls=%long\n", ""
    )
    only_b = LENGTHS.replace("tuple(%a, %b)", "tuple(%b)").replace(
        "  %a = f32[512]{0} fusion(%x), kind=kInput, calls=%wide\n", ""
    )
    assert "calls=%long" not in only_a and "calls=%wide" not in only_b
    wide = gpufusion.analyse(only_a, "float32").ops
    assert wide.kernels == 1 and wide.memory_bytes == 4.0 * (64 * 8 * 8 * 512 + 512)
    long = gpufusion.analyse(only_b, "float32").ops
    # the partial sums, then 91 of them (91^2 >= 8,192) summed into each of the 8 results
    final = 4.0 * 8 * (91 + 1)
    assert long.memory_classes == (("reduce", 4.0 * (2 * 64 * 64 * 8 + 8) + final, 2),)
    assert gpufusion.analyse(LENGTHS, "float32").ops.kernels == 3


def test_a_reduction_into_few_results_is_priced_by_one_lane():
    """Rule 9: XLA:GPU spreads a reduction over its results alone, so one into fewer than
    1,024 results, each summing 256 or more elements, runs at its results times one lane's rate
    (in an H100's programs, 4,096 rows into 192-448 BatchNorm statistics took 7 us whatever
    their number). LENGTHS's 4,096 into each of 512 is one such kernel; a split reduction's
    final kernel is one when it sums 256 or more partials into few results. A profile prices
    the class by its bytes per result; one that does not name it, as a reduction."""
    import dataclasses

    from jaxpar.predict import hardware

    only_a = LENGTHS.replace("tuple(%a, %b)", "tuple(%a)").replace(
        "  %b = f32[8]{0} fusion(%y), kind=kInput, calls=%long\n", ""
    )
    wide = gpufusion.analyse(only_a, "float32").ops
    moved = 4.0 * (64 * 8 * 8 * 512 + 512)
    assert wide.memory_classes == (("reduce_few", moved, 1),)
    assert wide.lane_bytes == pytest.approx(moved / 512)
    # 8 x 128 x 128 = 131,072 elements into each of 8 results: split, the final kernel summing
    # 363 partials (363^2 >= 131,072) into each
    deep = LENGTHS.replace("f32[2,64,64,8]", "f32[8,128,128,8]")
    deep = deep.replace("tuple(%a, %b)", "tuple(%b)").replace(
        "  %a = f32[512]{0} fusion(%x), kind=kInput, calls=%wide\n", ""
    )
    ops = gpufusion.analyse(deep, "float32").ops
    first, final = 4.0 * (8 * 128 * 128 * 8 + 8), 4.0 * 8 * (363 + 1)
    assert ops.memory_classes == (("reduce", first, 1), ("reduce_few", final, 1))
    assert ops.lane_bytes == pytest.approx(final / 8)
    base = hardware.Profile("g", 1, 1, {"float32": 1e12}, 1e9, hardware.Link(1e9, 0),
                            hardware.Link(1e9, 0), compute_efficiency=0.5, kernel_s=2e-6,
                            memory_bandwidth=1e12, compiler="gpu",
                            memory_kernel_costs={"reduce": (3e-6, 2e12)})  # fmt: skip
    # no reduce_few costs: both kernels at reduce's
    assert base.device_time(ops, "float32") == pytest.approx(2 * 3e-6 + (first + final) / 2e12)
    lanes = dataclasses.replace(base, memory_kernel_costs={"reduce": (3e-6, 2e12),
                                                           "reduce_few": (1e-6, 1e9)})  # fmt: skip
    assert lanes.device_time(ops, "float32") == pytest.approx(
        3e-6 + first / 2e12 + 1e-6 + (final / 8) / 1e9
    )
    assert lanes.device_time(wide, "float32") == pytest.approx(1e-6 + moved / 512 / 1e9)
    # along the minor dimension (x laid out [512, 4096] and summed over its 4,096), or into
    # one result: row reductions, a warp or a block per result, not reduce_few
    row = only_a.replace("f32[64,8,8,512]", "f32[512,4096]").replace("{3,2,1,0}", "{1,0}")
    row = row.replace("dimensions={0,1,2}", "dimensions={1}")
    assert gpufusion.analyse(row, "float32").ops.memory_classes == (("reduce", moved, 1),)
    one = LENGTHS.replace("f32[2,64,64,8]", "f32[8,128,128,8]").replace("f32[8]{0}", "f32[]")
    one = one.replace("-> f32[8]", "-> f32[]").replace("f32[8]{0})", "f32[])")
    one = one.replace(
        "dimensions={0,1,2}, to_apply=%add\n}\n\nENTRY",
        "dimensions={0,1,2,3}, to_apply=%add\n}\n\nENTRY",
    )
    one = one.replace("tuple(%a, %b)", "tuple(%b)").replace(
        "  %a = f32[512]{0} fusion(%x), kind=kInput, calls=%wide\n", ""
    )
    ops = gpufusion.analyse(one, "float32").ops
    assert [c for c, _, _ in ops.memory_classes] == ["reduce"] and ops.kernels == 2


def test_a_profile_prices_each_memory_class_at_its_own_costs():
    """memory_kernel_costs: a class named there costs its (seconds per kernel, bandwidth) in
    place of kernel_s and memory_bandwidth; the classes it does not name keep those."""
    import dataclasses

    from jaxpar.errors import ConfigError
    from jaxpar.predict import hardware

    ops = gpufusion.analyse(STATS, "float32").ops
    base = hardware.Profile("g", 1, 1, {"float32": 1e12}, 1e9, hardware.Link(1e9, 0),
                            hardware.Link(1e9, 0), compute_efficiency=0.5, kernel_s=2e-6,
                            memory_bandwidth=1e12, compiler="gpu")  # fmt: skip
    (_, reduce_bytes, _), (_, window_bytes, _) = ops.memory_classes
    assert base.device_time(ops, "float32") == pytest.approx(5 * 2e-6 + ops.memory_bytes / 1e12)
    classed = dataclasses.replace(base, memory_kernel_costs={"window": (5e-6, 0.5e12)})
    assert classed.device_time(ops, "float32") == pytest.approx(
        4 * 2e-6 + reduce_bytes / 1e12 + 5e-6 + window_bytes / 0.5e12
    )
    # a CPU profile prices the classes the same way (its programs carry them too since
    # 2026-11-27: configs/hardware/cpu_2core_models.py's generate kernels)
    cpu = dataclasses.replace(classed, compiler="cpu")
    assert cpu.device_time(ops, "float32") == pytest.approx(classed.device_time(ops, "float32"))
    with pytest.raises(ConfigError, match="memory_kernel_costs"):
        hardware.from_config({**_MINIMAL, "memory_kernel_costs": {"pool": (1e-6, 1e12)}})


_MINIMAL = {"name": "g", "num_devices": 1, "devices_per_node": 1, "peak_flops": {"float32": 1e12},
            "memory_bytes": 1e9, "intra": {"bandwidth": 1e9, "latency": 0.0},
            "compute_efficiency": 0.5, "compiler": "gpu"}  # fmt: skip
