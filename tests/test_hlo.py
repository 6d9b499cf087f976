"""The HLO reader (jaxpar/hlo) on small hand-written programs: computations, instructions,
operands, callees, shapes and collectives, each expected value worked out by hand."""

from __future__ import annotations

from jaxpar import hlo
from jaxpar.parallel.sync import traffic
from jaxpar.predict.kernels import library, matrix, opclass

PROGRAM = """HloModule m, entry_computation_layout={(f32[4,8]{1,0}, bf16[8,16]{1,0})->f32[8]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %a, f32[] %b)
}

%fused (p: f32[4,8]) -> f32[8] {
  %p = f32[4,8]{1,0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %r = f32[8]{0} reduce(f32[4,8]{1,0} %p, f32[] %zero), dimensions={0}, to_apply=%add
}

ENTRY %main (x: f32[4,8], w: bf16[8,16]) -> (f32[8], bf16[4,16]) {
  %x = f32[4,8]{1,0} parameter(0)
  %w = bf16[8,16]{1,0} parameter(1)
  %f = f32[8]{0} fusion(f32[4,8]{1,0} %x), kind=kInput, calls=%fused
  %c = bf16[4,8]{1,0} convert(f32[4,8]{1,0} %x)
  %d = bf16[4,16]{1,0} dot(bf16[4,8]{1,0} %c, bf16[8,16]{1,0} %w), lhs_contracting_dims={1}
  %ar = f32[8]{0} all-reduce(f32[8]{0} %f), replica_groups={{0,1},{2,3}}, to_apply=%add
  ROOT %t = (f32[8]{0}, bf16[4,16]{1,0}) tuple(f32[8]{0} %ar, bf16[4,16]{1,0} %d)
}
"""

# a predicated conditional (XLA:GPU prints true/false_computation) whose true branch swaps two
# devices' 16 bytes, and an asynchronous all-gather of 2 floats into 8 outside it
BRANCHED = """HloModule b

%swap (s: f32[4]) -> f32[4] {
  %s = f32[4]{0} parameter(0)
  ROOT %cp = f32[4]{0} collective-permute(f32[4]{0} %s), source_target_pairs={{0,1},{1,0}}
}

%keep (k: f32[4]) -> f32[4] {
  ROOT %k = f32[4]{0} parameter(0)
}

ENTRY %main (p: pred[], v: f32[4], g: f32[2]) -> f32[4] {
  %p = pred[] parameter(0)
  %v = f32[4]{0} parameter(1)
  %g = f32[2]{0} parameter(2)
  %ags = ((f32[2]{0}), f32[8]{0}) all-gather-start(f32[2]{0} %g), replica_groups={{0,1,2,3}}
  %agd = f32[8]{0} all-gather-done(((f32[2]{0}), f32[8]{0}) %ags)
  ROOT %cond = f32[4]{0} conditional(pred[] %p, f32[4]{0} %v, f32[4]{0} %v), true_computation=%swap, false_computation=%keep
}
"""


def test_a_program_reads_into_computations_and_instructions():
    program = hlo.parse(PROGRAM)
    assert list(program.computations) == ["add", "fused", "ENTRY"]
    assert [i.name for i in program.entry] == ["x", "w", "f", "c", "d", "ar", "t"]
    d = program.by_name["d"]
    assert (d.type, d.opcode, d.operands) == ("bf16[4,16]{1,0}", "dot", ["c", "w"])
    assert "lhs_contracting_dims={1}" in d.rest
    assert program.by_name["f"].callees == ["fused"]
    assert program.by_name["ar"].callees == ["add"]
    assert program.by_name["t"].operands == ["ar", "d"]
    assert program.types["r"] == "f32[8]{0}"
    assert program.body("missing") == ()
    assert hlo.count_ops(PROGRAM, "parameter") == 5 and hlo.count_ops(PROGRAM, "add") == 1


def test_callees_of_every_form_xla_prints():
    """A loop's condition and body (the body after a comma), a predicated conditional's
    branches, a fusion's callee before its metadata."""
    assert hlo.callees("s32[] %i), condition=%cond.1, body=%body.2, backend_config={}") == [
        "cond.1",
        "body.2",
    ]
    assert hlo.callees("f32[] %p), true_computation=%a.1, false_computation=%b_2") == ["a.1", "b_2"]
    assert hlo.callees("s32[] %i), branch_computations={%a.1, %b_2}") == ["a.1", "b_2"]
    assert hlo.callees('f32[] %x), kind=kLoop, calls=%fused.1, metadata={op_name="a"}') == [
        "fused.1"
    ]
    assert hlo.parse(BRANCHED).by_name["cond"].callees == ["swap", "keep"]


def test_shapes_first_array_largest_array_and_bytes():
    pair = "(f32[8]{0}, bf16[4,16]{1,0})"
    assert hlo.dims("f32[4,8]{1,0}") == [4, 8] and hlo.elements("f32[4,8]{1,0}") == 32
    assert hlo.dims("f32[]") == [] and hlo.elements("f32[]") == 1  # a scalar
    assert hlo.arrays(pair) == ["f32[8]", "bf16[4,16]"]
    assert hlo.elements(pair) == 8  # a tuple's first element
    assert hlo.largest_elements(pair) == 64
    assert hlo.shape_bytes(pair) == 8 * 4 + 64 * 2  # every element
    assert hlo.arrays("(f32[2]{0}, token[])") == ["f32[2]", "token[]"]
    assert hlo.shape_bytes("(f32[2]{0}, token[])") == 8  # a token holds no bytes
    assert hlo.arrays("(f8e4m3fn[4,4]{1,0}, c64[2])") == ["f8e4m3fn[4,4]", "c64[2]"]
    assert hlo.shape_bytes("(f8e4m3fn[4,4]{1,0}, c64[2])") == 16 + 16
    assert hlo.minor_dim("f32[4,8]{1,0}") == "1" and hlo.minor_dim("f32[4,8]{0,1}") == "0"
    assert hlo.minor_dim("f32[4,8]") is None


def test_collectives_with_groups_async_starts_and_branches():
    (ar,) = hlo.collectives(PROGRAM)
    assert (ar.kind, ar.bytes, ar.groups, ar.in_branch) == (
        "all-reduce",
        32,
        "{{0,1},{2,3}}",
        False,
    )
    permute, gather = hlo.collectives(BRANCHED)  # in the text's order
    # an async gather counts once, at its start, by its result (8 floats), not its operands
    assert (gather.kind, gather.bytes, gather.in_branch) == ("all-gather", 32, False)
    assert (permute.kind, permute.bytes, permute.in_branch) == ("collective-permute", 16, True)
    assert permute.pairs == ((0, 1), (1, 0))
    assert hlo.parse(BRANCHED).branch_computations == {"swap", "keep"}
    assert traffic.permute_bytes(BRANCHED, 2) == ([16, 16], [16, 16])
    assert traffic.conditional_collectives(BRANCHED) == 1
    # programs' texts joined into one (benchmarks/sync_study.py) are read apart
    assert hlo.collectives(PROGRAM + BRANCHED) == [ar, permute, gather]


def test_replica_groups_in_every_form_and_a_backend_config_as_json():
    """Replica groups read into devices from each form XLA prints; a cuBLAS call's
    backend_config read as JSON, printed bare or quoted, and its contracting dimensions."""
    assert hlo.replica_groups("{{0,1},{2,3}}") == [[0, 1], [2, 3]]
    assert hlo.replica_groups("[2,4]<=[8]") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert hlo.replica_groups("[4,2]<=[2,4]T(1,0)") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert hlo.replica_groups("mesh['x'=2,'y'=4] {'x'}") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    config = (
        '{"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"]}}}'
    )
    rest = '%a, %b), custom_call_target="__cublas$gemm", backend_config='
    for printed in (config, '"' + config.replace('"', '\\"') + '"'):
        ins = hlo.Instruction("c", "(f32[8,16]{1,0}, s8[0]{0})", "custom-call", rest + printed)
        assert ins.backend_config()["gemm_backend_config"]["dot_dimension_numbers"] == {
            "lhs_contracting_dimensions": ["1"]
        }
        mm = library.library_matmul(ins, {"a": "f32[8,4]{1,0}", "b": "f32[4,16]{1,0}"})
        assert mm.flops == 2 * 8 * 16 * 4
    assert hlo.Instruction("c", "f32[]", "custom-call", "%a)").backend_config() == {}


def test_op_classes_of_the_program():
    """The dot: 2 x 4 x 16 x 8 FLOPs, its narrowest GEMM side the 4 rows. The fusion's reduce
    (8 results of 4 elements, summed across the minor dimension's rows: not a row reduction)
    reads its whole 128-byte operand and writes 32; the convert reads 128 and writes 64."""
    ops = opclass.classify(PROGRAM)
    assert ops.matmul_flops == 2 * 4 * 16 * 8 and ops.conv3x3_flops == 0
    assert [m.narrow for m in ops.matmuls] == [4]
    assert ops.kernels == 3  # the fusion, the convert, the dot
    assert ops.memory_classes == (("elementwise", 192.0, 1), ("reduce", 160.0, 1))
    assert ops.memory_bytes == 352


LOOP = """HloModule w

%cond (c: (s32[], f32[4,4])) -> pred[] {
  %c = (s32[], f32[4,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element((s32[], f32[4,4]{1,0}) %c), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(s32[] %i, s32[] %n), direction=LT
}

%body (b: (s32[], f32[4,4])) -> (s32[], f32[4,4]) {
  %b = (s32[], f32[4,4]{1,0}) parameter(0)
  %j = s32[] get-tuple-element((s32[], f32[4,4]{1,0}) %b), index=0
  %m = f32[4,4]{1,0} get-tuple-element((s32[], f32[4,4]{1,0}) %b), index=1
  %d = f32[4,4]{1,0} dot(f32[4,4]{1,0} %m, f32[4,4]{1,0} %m), lhs_contracting_dims={1}
  ROOT %t = (s32[], f32[4,4]{1,0}) tuple(s32[] %j, f32[4,4]{1,0} %d)
}

ENTRY %main (x: f32[4,4]) -> (s32[], f32[4,4]) {
  %x = f32[4,4]{1,0} parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], f32[4,4]{1,0}) tuple(s32[] %z, f32[4,4]{1,0} %x)
  ROOT %w = (s32[], f32[4,4]{1,0}) while((s32[], f32[4,4]{1,0}) %init), condition=%cond, body=%body
}
"""


def test_a_loops_condition_and_body_are_classified():
    """The body's dot (2 x 4 x 4 x 4 FLOPs) and the condition's compare (reads two 4-byte
    scalars, writes a 1-byte pred) each count once: the trip count is not read."""
    ops = opclass.classify(LOOP)
    assert ops.matmul_flops == 128 and ops.kernels == 2 and ops.memory_bytes == 9


# a cuDNN call as XLA:GPU prints it: commas, braces and "=" inside quoted strings and nested
# braces and brackets of its values are parts of one value
CALL = hlo.Instruction(
    "c",
    "(f32[8,8,16,12]{3,2,1,0}, u8[0]{0})",
    "custom-call",
    "f32[8,16,16,4]{3,2,1,0} %x, f32[12,3,3,2]{3,2,1,0} %w), window={size=3x3 stride=2x1 "
    "pad=1_1x0_-2 lhs_dilate=1x2}, dim_labels=b01f_o01i->b01f, feature_group_count=2, "
    'custom_call_target="__cudnn$convForward", metadata={op_name="f/conv(a, {b" line=3}, '
    'backend_config={"algo":{"knobs":{},"ids":["1","2"]},"q":"0"}',
)


def test_an_instructions_attributes_each_read_whole():
    assert CALL.operands == ["x", "w"]
    assert CALL.attributes == {
        "window": "{size=3x3 stride=2x1 pad=1_1x0_-2 lhs_dilate=1x2}",
        "dim_labels": "b01f_o01i->b01f",
        "feature_group_count": "2",
        "custom_call_target": "__cudnn$convForward",  # a quoted value without its quotes
        "metadata": '{op_name="f/conv(a, {b" line=3}',
        "backend_config": '{"algo":{"knobs":{},"ids":["1","2"]},"q":"0"}',
    }
    assert CALL.attribute("feature_group_count") == "2" and CALL.attribute("missing") is None
    # an iota's groups (a bracket's comma), a comment and a tuple's parenthesis among the
    # operands, a quoted value with escaped quotes (and a comma between them), spaces at the end
    ar = hlo.Instruction(
        "ar",
        "f32[8]{0}",
        "all-reduce",
        "(f32[], f32[]) %t, /*index=1*/f32[8]{0} %f), channel_id=1, replica_groups=[2,4]<=[8], "
        'use_global_device_ids=true, to_apply=%add, backend_config="{\\"k\\":\\"a, b\\"}"  ',
    )
    assert ar.operands == ["t", "f"]
    assert ar.attributes == {
        "channel_id": "1",
        "replica_groups": "[2,4]<=[8]",
        "use_global_device_ids": "true",
        "to_apply": "%add",
        "backend_config": '{\\"k\\":\\"a, b\\"}',
    }
    assert hlo.Instruction("t", "()", "tuple", ")").attributes == {}


def test_lists_windows_and_dimension_labels():
    assert CALL.window() == {
        "size": (3, 3),
        "stride": (2, 1),
        "pad": (1, 1, 0, -2),
        "lhs_dilate": (1, 2),
    }
    assert CALL.dim_labels() == ("b01f", "o01i", "b01f")
    r = hlo.parse(PROGRAM).by_name["r"]  # reduce(...), dimensions={0}, to_apply=%add
    assert r.ints("dimensions") == (0,) and r.attribute("to_apply") == "%add"
    assert r.window() == {} and r.dim_labels() is None and r.ints("missing") == ()
    rest = "f32[2,4,3]{2,1,0} %p, f32[] %z), dimensions={0,2}, to_apply=%add"
    assert hlo.Instruction("s", "f32[4]{0}", "reduce", rest).ints("dimensions") == (0, 2)


def test_a_convolution_with_feature_groups_is_not_winograd():
    """A depthwise 3x3 convolution (16 groups of one feature: a count the regular expression
    before the attribute reader took for no groups) or one of 2 groups is neither a Winograd
    kernel nor a layer of the kernel table; the same window without groups is both."""
    types = {"x": "f32[4,16,16,16]{3,2,1,0}", "w": "f32[3,3,1,16]{3,2,1,0}"}
    rest = "%x, %w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f"
    for groups, winograd in (
        (", feature_group_count=16", False),
        (", feature_group_count=2", False),
        ("", True),
    ):
        conv = hlo.Instruction("c", "f32[4,16,16,16]{3,2,1,0}", "convolution", rest + groups)
        m = matrix.matmul(conv, types)
        assert m.winograd == winograd and bool(m.keys) == winograd, groups
        assert m.flops == 2 * 4 * 16 * 16 * 16 * 3 * 3
