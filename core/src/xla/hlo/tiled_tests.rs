//! The pass on JAX's tiled all_to_all (`tiled.rs`), on modules built field by field.

use super::proto::{instruction, module, Instruction, Shape};
use super::tests::{
    after_prologue, array, collectives, computation_of, entry, find, loop_entry_and_condition,
    module_of, parameter, rewritten, F32,
};
use super::wire::Message;

// JAX's tiled all_to_all as XLA hands it over: slices of the array (fusions wrapping one
// slice, or plain slices), a tuple all-to-all of them, a concatenate of its results.

/// A `SliceDimensions` list: `[start, limit)` per dimension, stride 1.
fn slice_ranges(inst: &mut Instruction, ranges: &[(i64, i64)]) {
    for &(start, limit) in ranges {
        let mut d = Message::default();
        d.set_int(super::proto::slice::START, start);
        d.set_int(super::proto::slice::LIMIT, limit);
        d.set_int(super::proto::slice::STRIDE, 1);
        inst.0.push_message(instruction::SLICE_DIMENSIONS, &d);
    }
}

/// A fusion (id `id`) of `of` calling computation `called`, which slices its parameter.
fn fused_slice(
    id: i64,
    called: i64,
    of: i64,
    whole: &Shape,
    part: &Shape,
    ranges: &[(i64, i64)],
) -> (Instruction, Vec<u8>) {
    let mut cut = Instruction::new(called * 10 + 1, "slice", "slice", part, &[called * 10]);
    slice_ranges(&mut cut, ranges);
    let body = computation_of(
        called,
        &format!("wrapped_slice_computation{called}"),
        vec![parameter(called * 10, 0, whole), cut],
        called * 10 + 1,
    );
    let mut fusion = Instruction::new(id, &format!("wrapped_slice{id}"), "fusion", part, &[of]);
    fusion
        .0
        .set_ints(instruction::CALLED_COMPUTATION_IDS, &[called]);
    (fusion, body)
}

/// A tuple all-to-all (id 40) of `operands` over both partitions, its results read by
/// get-tuple-elements 41, 42 and concatenated along `dim` by instruction 43.
fn tuple_all_to_all(operands: &[i64], part: &Shape, whole: &Shape, dim: i64) -> Vec<Instruction> {
    let parts = vec![part.clone(); operands.len()];
    let mut a = Instruction::new(
        40,
        "all-to-all",
        "all-to-all",
        &Shape::tuple(&parts),
        operands,
    );
    a.0.set_int(instruction::CHANNEL_ID, 1);
    let mut group = Message::default();
    group.set_ints(1, &[0, 1]);
    let mut list = Message::default();
    list.push_message(1, &group);
    a.0.set_message(instruction::COLLECTIVE_DEVICE_LIST, &list);
    let mut out = vec![a];
    for k in 0..operands.len() {
        out.push(Instruction::get_tuple_element(
            41 + k as i64,
            &format!("gte{k}"),
            part,
            40,
            k,
        ));
    }
    let mut c = Instruction::new(43, "concatenate", "concatenate", whole, &[41, 42]);
    c.0.set_ints(instruction::DIMENSIONS, &[dim]);
    out.push(c);
    out
}

/// The module of a tiled all_to_all of an f32[8] over 2 partitions, its slices
/// `ranges[0]` and `ranges[1]`, and `extra` instructions after the concatenate (the root:
/// `root`).
fn tiled_module(ranges: [(i64, i64); 2], extra: Vec<Instruction>, root: i64) -> Vec<u8> {
    let (whole, part) = (array(F32, &[8]), array(F32, &[4]));
    let (s0, c0) = fused_slice(5, 2, 4, &whole, &part, &[ranges[0]]);
    let (s1, c1) = fused_slice(6, 3, 4, &whole, &part, &[ranges[1]]);
    let mut instructions = vec![parameter(4, 0, &whole), s0, s1];
    instructions.extend(tuple_all_to_all(&[5, 6], &part, &whole, 0));
    instructions.extend(extra);
    module_of(vec![entry(instructions, root), c0, c1])
}

#[test]
fn a_tiled_all_to_all_becomes_one_call_on_the_whole_array() {
    let computations = rewritten(&tiled_module([(0, 4), (4, 8)], vec![], 43));
    // The slices' computations are called by nothing any more: gone.
    assert_eq!(computations.len(), 1);
    let main = &computations[0];
    let [call] = collectives(main)[..] else {
        panic!("one call")
    };
    assert_eq!(call.target(), "jaxmpi_hlo_all_to_all");
    assert_eq!(call.operands().unwrap(), vec![4, after_prologue(main)]);
    let config = call.0.string(instruction::BACKEND_CONFIG);
    assert!(
        config.contains("outer = dense<[1]> : tensor<1xi64>"),
        "{config}"
    );
    assert!(!call.0.has(instruction::OUTPUT_OPERAND_ALIASING));
    let elements = call.shape().unwrap().elements().unwrap();
    assert_eq!(elements.len(), 2);
    assert_eq!(elements[0].dims().unwrap(), vec![8]);
    for opcode in ["fusion", "concatenate", "all-to-all", "tuple"] {
        assert!(find(main, opcode).is_empty(), "a {opcode} is left");
    }
    // The concatenate's id names the call's result: the root is unchanged.
    assert_eq!(main.root_id(), 43);
    let value = main.instructions.iter().find(|i| i.id() == 43).unwrap();
    assert_eq!(value.opcode(), "get-tuple-element");
    assert_eq!(value.operands().unwrap(), vec![call.id()]);
    assert_eq!(value.shape().unwrap().dims().unwrap(), vec![8]);
}

#[test]
fn a_tiled_all_to_all_of_plain_slices_inside_a_dimension_counts_its_outer_slices() {
    // f32[3,8] split along dimension 1 (row-major: 3 slices outside it), plain slices.
    let (whole, part) = (array(F32, &[3, 8]), array(F32, &[3, 4]));
    let mut s0 = Instruction::new(5, "slice0", "slice", &part, &[4]);
    slice_ranges(&mut s0, &[(0, 3), (0, 4)]);
    let mut s1 = Instruction::new(6, "slice1", "slice", &part, &[4]);
    slice_ranges(&mut s1, &[(0, 3), (4, 8)]);
    let mut instructions = vec![parameter(4, 0, &whole), s0, s1];
    instructions.extend(tuple_all_to_all(&[5, 6], &part, &whole, 1));
    let main = &rewritten(&module_of(vec![entry(instructions, 43)]))[0];
    let [call] = collectives(main)[..] else {
        panic!("one call")
    };
    assert_eq!(call.operands().unwrap()[0], 4);
    let config = call.0.string(instruction::BACKEND_CONFIG);
    assert!(
        config.contains("outer = dense<[3]> : tensor<1xi64>"),
        "{config}"
    );
    assert!(find(main, "slice").is_empty() && find(main, "concatenate").is_empty());
}

/// The module's one call is the tuple all-to-all it was: two arrays in, two out, and the
/// concatenate is still there.
fn left_as_a_tuple_all_to_all(bytes: &[u8]) {
    let computations = rewritten(bytes);
    let main = &computations[0];
    let [call] = collectives(main)[..] else {
        panic!("one call")
    };
    assert_eq!(call.operands().unwrap()[..2], [5, 6]);
    let config = call.0.string(instruction::BACKEND_CONFIG);
    assert!(
        config.contains("outer = dense<> : tensor<0xi64>"),
        "{config}"
    );
    assert_eq!(find(main, "concatenate").len(), 1);
    assert_eq!(find(main, "fusion").len(), 2);
    assert_eq!(computations.len(), 3);
}

#[test]
fn slices_out_of_order_are_left_alone() {
    left_as_a_tuple_all_to_all(&tiled_module([(4, 8), (0, 4)], vec![], 43));
}

#[test]
fn slices_that_leave_part_of_the_array_out_are_left_alone() {
    left_as_a_tuple_all_to_all(&tiled_module([(0, 4), (2, 6)], vec![], 43));
}

#[test]
fn a_result_read_elsewhere_too_is_left_alone() {
    let part = array(F32, &[4]);
    let twice = Instruction::new(50, "twice", "add", &part, &[41, 41]);
    let root = Instruction::new(
        51,
        "both",
        "tuple",
        &Shape::tuple(&[array(F32, &[8]), part.clone()]),
        &[43, 50],
    );
    left_as_a_tuple_all_to_all(&tiled_module([(0, 4), (4, 8)], vec![twice, root], 51));
}

#[test]
fn a_concatenate_along_another_dimension_is_left_alone() {
    // f32[2,4] sliced along dimension 0, the results put side by side along dimension 1.
    let (whole, part) = (array(F32, &[2, 4]), array(F32, &[1, 4]));
    let mut s0 = Instruction::new(5, "slice0", "slice", &part, &[4]);
    slice_ranges(&mut s0, &[(0, 1), (0, 4)]);
    let mut s1 = Instruction::new(6, "slice1", "slice", &part, &[4]);
    slice_ranges(&mut s1, &[(1, 2), (0, 4)]);
    let mut instructions = vec![parameter(4, 0, &whole), s0, s1];
    instructions.extend(tuple_all_to_all(&[5, 6], &part, &array(F32, &[1, 8]), 1));
    let main = &rewritten(&module_of(vec![entry(instructions, 43)]))[0];
    let [call] = collectives(main)[..] else {
        panic!("one call")
    };
    assert_eq!(call.operands().unwrap()[..2], [5, 6]);
    assert_eq!(find(main, "concatenate").len(), 1);
}

#[test]
fn a_tiled_all_to_all_of_a_donated_argument_reads_a_copy_of_it() {
    // XLA may put the result in the donated argument's memory, which MPI cannot send
    // from and receive into at once: the call reads a copy.
    let bytes = tiled_module([(0, 4), (4, 8)], vec![], 43);
    let mut m = Message::parse(&bytes).unwrap();
    let mut entry = Message::default();
    entry.set_int(4, 1);
    let mut alias = Message::default();
    alias.push_message(1, &entry);
    m.set_message(module::INPUT_OUTPUT_ALIAS, &alias);
    let main = &rewritten(&m.encode())[0];
    let [call] = collectives(main)[..] else {
        panic!("one call")
    };
    let [copy] = find(main, "copy")[..] else {
        panic!("one copy")
    };
    assert_eq!(copy.operands().unwrap(), vec![4]);
    assert_eq!(call.operands().unwrap()[0], copy.id());
    assert!(find(main, "concatenate").is_empty());
    // Without donation, the argument is read where it is.
    let main = &rewritten(&tiled_module([(0, 4), (4, 8)], vec![], 43))[0];
    assert!(find(main, "copy").is_empty());
}

#[test]
fn a_tiled_all_to_all_of_a_loop_state_element_reads_a_copy_of_it() {
    // The body gives the result back as the element it read: one buffer, unless copied.
    let (whole, part) = (array(F32, &[8]), array(F32, &[4]));
    let state = Shape::tuple(std::slice::from_ref(&whole));
    let (s0, c0) = fused_slice(5, 4, 21, &whole, &part, &[(0, 4)]);
    let (s1, c1) = fused_slice(6, 5, 21, &whole, &part, &[(4, 8)]);
    let mut instructions = vec![
        parameter(20, 0, &state),
        Instruction::get_tuple_element(21, "element", &whole, 20, 0),
        s0,
        s1,
    ];
    instructions.extend(tuple_all_to_all(&[5, 6], &part, &whole, 0));
    instructions.push(Instruction::new(23, "next", "tuple", &state, &[43]));
    let body = computation_of(2, "body", instructions, 23);
    let (entry, condition) = loop_entry_and_condition(&whole);
    let bytes = module_of(vec![entry, body, condition, c0, c1]);
    let computations = rewritten(&bytes);
    assert_eq!(computations.len(), 3, "the slices' computations are gone");
    let body = &computations[1];
    let [call] = collectives(body)[..] else {
        panic!("one call in the body")
    };
    let [copy] = find(body, "copy")[..] else {
        panic!("one copy")
    };
    assert_eq!(copy.operands().unwrap(), vec![21]);
    assert_eq!(call.operands().unwrap()[0], copy.id());
    assert!(find(body, "concatenate").is_empty() && find(body, "fusion").is_empty());
}

/// `tiled_module` with the concatenate wrapped in a fusion (XLA:CPU from jaxlib 0.12.1 on):
/// fusion 43 calls computation 7, whose parameters `order` give its concatenate's operands.
fn fused_concatenate_module(order: [i64; 2]) -> Vec<u8> {
    let (whole, part) = (array(F32, &[8]), array(F32, &[4]));
    let (s0, c0) = fused_slice(5, 2, 4, &whole, &part, &[(0, 4)]);
    let (s1, c1) = fused_slice(6, 3, 4, &whole, &part, &[(4, 8)]);
    let mut instructions = vec![parameter(4, 0, &whole), s0, s1];
    let mut pattern = tuple_all_to_all(&[5, 6], &part, &whole, 0);
    let joined = pattern.pop().expect("the concatenate");
    let mut fusion = Instruction::new(43, "wrapped_concatenate", "fusion", &whole, &[41, 42]);
    fusion.0.set_ints(instruction::CALLED_COMPUTATION_IDS, &[7]);
    instructions.extend(pattern);
    instructions.push(fusion);
    let mut concatenate = Instruction::new(72, "concatenate", "concatenate", &whole, &[70, 71]);
    concatenate.0.set_ints(
        instruction::DIMENSIONS,
        &joined.0.ints(instruction::DIMENSIONS).unwrap(),
    );
    let body = computation_of(
        7,
        "wrapped_concatenate_computation",
        vec![
            parameter(70, order[0], &part),
            parameter(71, order[1], &part),
            concatenate,
        ],
        72,
    );
    module_of(vec![entry(instructions, 43), c0, c1, body])
}

#[test]
fn a_fused_concatenate_of_the_results_is_the_same_pattern() {
    let computations = rewritten(&fused_concatenate_module([0, 1]));
    assert_eq!(
        computations.len(),
        1,
        "the fusions' computations are called by nothing"
    );
    let main = &computations[0];
    let [call] = collectives(main)[..] else {
        panic!("one call")
    };
    assert_eq!(call.target(), "jaxmpi_hlo_all_to_all");
    assert_eq!(call.operands().unwrap()[0], 4);
    for opcode in ["fusion", "concatenate", "all-to-all"] {
        assert!(find(main, opcode).is_empty(), "a {opcode} is left");
    }
    assert_eq!(main.root_id(), 43);
}

#[test]
fn a_fused_concatenate_that_swaps_its_operands_is_left_alone() {
    let computations = rewritten(&fused_concatenate_module([1, 0]));
    let main = &computations[0];
    let [call] = collectives(main)[..] else {
        panic!("one call")
    };
    assert_eq!(call.operands().unwrap()[..2], [5, 6]);
    assert_eq!(find(main, "fusion").len(), 3);
    assert_eq!(computations.len(), 4);
}
