"""Where a gradient collective stands in its program (jaxpar/predict/comm/overlap.py): read from a
hand-written program, and the exposed time of transfers sent from their ready points."""

from __future__ import annotations

import pytest

from jaxpar.predict.comm import overlap

# Two dots (the "backward"): the first gradient is ready after the first (1/3 of the FLOPs),
# the second after both. A combined all-reduce of both (as XLA joins them), and an
# asynchronous all-reduce of the first whose start and done have the second dot between.
PROGRAM = """HloModule m, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[16,32], w: f32[32,64], v: f32[32,128]) -> (f32[32,64], f32[32,128], f32[32,64]) {
  %x = f32[16,32]{1,0} parameter(0)
  %w = f32[32,64]{1,0} parameter(1)
  %v = f32[32,128]{1,0} parameter(2)
  %g1 = f32[32,64]{1,0} dot(%x, %w), lhs_contracting_dims={0}, rhs_contracting_dims={1}
  %s = f32[32,64]{1,0} all-reduce-start(%g1), replica_groups={{0,1}}, to_apply=%add
  %g2 = f32[32,128]{1,0} dot(%x, %v), lhs_contracting_dims={0}, rhs_contracting_dims={1}
  %d = f32[32,64]{1,0} all-reduce-done(%s)
  %ar = (f32[32,64]{1,0}, f32[32,128]{1,0}) all-reduce(%g1, %g2), replica_groups={{0,1}}, to_apply=%add
  %a1 = f32[32,64]{1,0} get-tuple-element(%ar), index=0
  %a2 = f32[32,128]{1,0} get-tuple-element(%ar), index=1
  ROOT %t = (f32[32,64]{1,0}, f32[32,128]{1,0}, f32[32,64]{1,0}) tuple(%a1, %a2, %d)
}
"""


def test_windows_read_readiness_and_async_pairs():
    got = overlap.windows(PROGRAM, {"data": 2})
    assert [(w.kind, w.axes, w.bytes) for w in got] == [
        ("all-reduce", "data", 4 * 32 * 64),  # the async one
        ("all-reduce", "data", 4 * 32 * 64),  # the combined one, element by element
        ("all-reduce", "data", 4 * 32 * 128),
    ]
    flops1, flops2 = 2 * 32 * 64 * 16, 2 * 32 * 128 * 16  # the two dots
    first = flops1 / (flops1 + flops2)
    assert [w.ready for w in got] == pytest.approx([first, first, 1.0])
    assert got[0].between == pytest.approx(1 - first)  # the second dot runs under it
    assert got[1].between is None and got[2].between is None  # synchronous


def test_exposed_sends_one_at_a_time_from_ready_points():
    # compute 10 s; transfers of 2 s ready at 0.1 and 0.9 of it: the first ends at 3, the
    # second starts at 9 and ends at 11: 1 s exposed
    assert overlap.exposed([2.0, 2.0], [0.9, 0.1], 10.0) == pytest.approx(1.0)
    # everything ready at the end: all of it exposed
    assert overlap.exposed([2.0, 3.0], [1.0, 1.0], 10.0) == pytest.approx(5.0)
    # a queue: both ready early but 12 s of sending for 10 s of compute
    assert overlap.exposed([6.0, 6.0], [0.0, 0.0], 10.0) == pytest.approx(2.0)


# XLA:GPU's form: a gradient's all-reduce started after a dot, with a cuDNN convolution (a
# custom call, as XLA:GPU holds every convolution) scheduled before its done.
GPU_PROGRAM = """HloModule g, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[16,32], w: f32[32,64], i: f32[8,16,16,4], k: f32[12,3,3,4]) -> (f32[32,64], f32[8,16,16,12]) {
  %x = f32[16,32]{1,0} parameter(0)
  %w = f32[32,64]{1,0} parameter(1)
  %i = f32[8,16,16,4]{3,2,1,0} parameter(2)
  %k = f32[12,3,3,4]{3,2,1,0} parameter(3)
  %g = f32[32,64]{1,0} dot(%x, %w), lhs_contracting_dims={0}, rhs_contracting_dims={1}
  %s = f32[32,64]{1,0} all-reduce-start(%g), replica_groups={{0,1}}, to_apply=%add
  %c = (f32[8,16,16,12]{3,2,1,0}, u8[0]{0}) custom-call(%i, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward"
  %y = f32[8,16,16,12]{3,2,1,0} get-tuple-element(%c), index=0
  %d = f32[32,64]{1,0} all-reduce-done(%s)
  ROOT %t = (f32[32,64]{1,0}, f32[8,16,16,12]{3,2,1,0}) tuple(%d, %y)
}
"""


def test_a_cudnn_convolution_counts_as_work_under_a_collective():
    """On XLA:GPU's programs the convolutions are cuDNN calls: their FLOPs are the work that
    runs between an all-reduce's start and its done (without them nothing would hide)."""
    (w,) = overlap.windows(GPU_PROGRAM, {"data": 2})
    dot, conv = 2 * 32 * 64 * 16, 2 * 8 * 16 * 16 * 12 * 3 * 3 * 4
    assert w.ready == pytest.approx(dot / (dot + conv))
    assert w.between == pytest.approx(conv / (dot + conv))
