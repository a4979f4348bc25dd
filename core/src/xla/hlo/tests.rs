//! The pass on small modules built here field by field, as XLA would hand them over: what
//! a collective becomes, where the token goes, when a result may take its operand's
//! memory, and each refusal. (The modules JAX really makes are run in
//! tests/python/test_jax_collectives.py.)

use super::pass::rewrite_module;
use super::proto::{computation, instruction, module, shape, Computation, Instruction, Shape};
use super::wire::Message;

fn array(element_type: i64, dims: &[i64]) -> Shape {
    let mut m = Message::default();
    m.set_int(shape::ELEMENT_TYPE, element_type);
    m.set_ints(shape::DIMENSIONS, dims);
    let mut layout = Message::default();
    let minor_to_major: Vec<i64> = (0..dims.len() as i64).rev().collect();
    layout.set_ints(shape::MINOR_TO_MAJOR, &minor_to_major);
    m.set_message(shape::LAYOUT, &layout);
    Shape(m)
}

const F32: i64 = 11;

fn parameter(id: i64, number: i64, shape: &Shape) -> Instruction {
    let mut p = Instruction::new(id, &format!("p{id}"), "parameter", shape, &[]);
    p.0.set_int(instruction::PARAMETER_NUMBER, number);
    p
}

fn computation_of(id: i64, name: &str, instructions: Vec<Instruction>, root: i64) -> Vec<u8> {
    let mut rest = Message::default();
    rest.set_string(computation::NAME, name);
    for inst in &instructions {
        rest.push_message(computation::INSTRUCTIONS, &inst.0);
    }
    rest.set_int(computation::ID, id);
    rest.set_int(computation::ROOT_ID, root);
    rest.encode()
}

/// A scalar `add` reducer, computation 1.
fn adder() -> Vec<u8> {
    let scalar = array(F32, &[]);
    let add = Instruction::new(12, "add", "add", &scalar, &[10, 11]);
    computation_of(
        1,
        "add",
        vec![parameter(10, 0, &scalar), parameter(11, 1, &scalar), add],
        12,
    )
}

/// A module of `computations` (the entry is computation 0) on 1 replica x 2 partitions.
fn module_of(computations: Vec<Vec<u8>>) -> Vec<u8> {
    let mut m = Message::default();
    for c in &computations {
        m.push(module::COMPUTATIONS, super::wire::Value::Bytes(c.clone()));
    }
    m.set_int(module::ENTRY_COMPUTATION_ID, 0);
    let mut assignment = Message::default();
    assignment.set_int(1, 1);
    assignment.set_int(2, 2);
    for device in [0, 2048] {
        let mut partition = Message::default();
        partition.set_ints(1, &[device]);
        assignment.push_message(3, &partition);
    }
    m.set_message(module::DEVICE_ASSIGNMENT, &assignment);
    m.encode()
}

/// A psum of `operand` over both partitions, id 3.
fn all_reduce(operand: i64, shape: &Shape) -> Instruction {
    let mut ar = Instruction::new(3, "psum", "all-reduce", shape, &[operand]);
    ar.0.set_int(instruction::CHANNEL_ID, 1);
    ar.0.set_int(instruction::USE_GLOBAL_DEVICE_IDS, 1);
    ar.0.set_ints(instruction::CALLED_COMPUTATION_IDS, &[1]);
    let mut group = Message::default();
    group.set_ints(1, &[0, 1]);
    let mut list = Message::default();
    list.push_message(1, &group);
    ar.0.set_message(instruction::COLLECTIVE_DEVICE_LIST, &list);
    ar
}

fn entry(instructions: Vec<Instruction>, root: i64) -> Vec<u8> {
    computation_of(0, "main", instructions, root)
}

fn rewritten(bytes: &[u8]) -> Vec<Computation> {
    let done = rewrite_module(bytes).expect("rewritten").expect("changed");
    let m = Message::parse(&done.module).unwrap();
    m.all_bytes(module::COMPUTATIONS)
        .map(|c| Computation::parse(c).unwrap())
        .collect()
}

fn find<'a>(c: &'a Computation, opcode: &str) -> Vec<&'a Instruction> {
    c.instructions
        .iter()
        .filter(|i| i.opcode() == opcode)
        .collect()
}

#[test]
fn a_psum_becomes_a_call_taking_and_giving_the_token() {
    let x = array(F32, &[4]);
    let bytes = module_of(vec![
        entry(vec![parameter(2, 0, &x), all_reduce(2, &x)], 3),
        adder(),
    ]);
    let computations = rewritten(&bytes);
    let main = &computations[0];
    let [call] = find(main, "custom-call")[..] else {
        panic!("one call")
    };
    assert_eq!(call.target(), "jaxmpi_hlo_all_reduce");
    let config = call.0.string(instruction::BACKEND_CONFIG);
    assert!(
        config.contains("groups = dense<[2, 0, 2048]> : tensor<3xi64>"),
        "{config}"
    );
    assert!(config.contains("op = 0 : i64"), "{config}");
    let [token] = find(main, "after-all")[..] else {
        panic!("one fresh token")
    };
    assert_eq!(call.operands().unwrap(), vec![2, token.id()]);
    // A parameter's memory is the caller's: the result never takes it.
    assert!(!call.0.has(instruction::OUTPUT_OPERAND_ALIASING));
    // The psum's id now names the call's first result: the root needs no change.
    let value = main.instructions.iter().find(|i| i.id() == 3).unwrap();
    assert_eq!(value.opcode(), "get-tuple-element");
    assert_eq!(value.operands().unwrap(), vec![call.id()]);
    assert_eq!(main.root_id(), 3);
}

#[test]
fn a_fresh_operand_used_once_is_written_in_place() {
    let x = array(F32, &[4]);
    let doubled = Instruction::new(5, "doubled", "add", &x, &[2, 2]);
    let bytes = module_of(vec![
        entry(vec![parameter(2, 0, &x), doubled, all_reduce(5, &x)], 3),
        adder(),
    ]);
    let main = &rewritten(&bytes)[0];
    let [call] = find(main, "custom-call")[..] else {
        panic!("one call")
    };
    assert!(call.0.has(instruction::OUTPUT_OPERAND_ALIASING));
}

#[test]
fn an_operand_used_elsewhere_too_keeps_its_memory() {
    let x = array(F32, &[4]);
    let doubled = Instruction::new(5, "doubled", "add", &x, &[2, 2]);
    let sum = Instruction::new(6, "sum", "add", &x, &[3, 5]);
    let bytes = module_of(vec![
        entry(
            vec![parameter(2, 0, &x), doubled, all_reduce(5, &x), sum],
            6,
        ),
        adder(),
    ]);
    let main = &rewritten(&bytes)[0];
    let [call] = find(main, "custom-call")[..] else {
        panic!("one call")
    };
    assert!(!call.0.has(instruction::OUTPUT_OPERAND_ALIASING));
}

#[test]
fn the_token_goes_through_a_loop_state() {
    let x = array(F32, &[4]);
    let state = Shape::tuple(std::slice::from_ref(&x));
    let pred = array(1, &[]);
    // Body (computation 2): psum of the state's element, back into a tuple.
    let body = computation_of(
        2,
        "body",
        vec![
            parameter(20, 0, &state),
            Instruction::get_tuple_element(21, "element", &x, 20, 0),
            {
                let mut ar = all_reduce(21, &x);
                ar.0.set_int(instruction::ID, 22);
                ar
            },
            Instruction::new(23, "next", "tuple", &state, &[22]),
        ],
        23,
    );
    let condition = computation_of(
        3,
        "condition",
        vec![
            parameter(30, 0, &state),
            Instruction::new(31, "go", "constant", &pred, &[]),
        ],
        31,
    );
    let mut lp = Instruction::new(4, "loop", "while", &state, &[5]);
    lp.0.set_ints(instruction::CALLED_COMPUTATION_IDS, &[2, 3]);
    let bytes = module_of(vec![
        entry(
            vec![
                parameter(2, 0, &x),
                Instruction::new(5, "init", "tuple", &state, &[2]),
                lp,
            ],
            4,
        ),
        adder(),
        body,
        condition,
    ]);
    let computations = rewritten(&bytes);
    let (main, body, condition) = (&computations[0], &computations[2], &computations[3]);
    let while_loop = main.instructions.iter().find(|i| i.id() == 4).unwrap();
    let elements = while_loop.shape().unwrap().elements().unwrap();
    assert_eq!(elements.len(), 2);
    assert!(elements[1].is_token());
    // The body takes the token from its state, gives it to the call, and puts back
    // the call's.
    let [call] = find(body, "custom-call")[..] else {
        panic!("one call in the body")
    };
    let token_in = call.operands().unwrap()[1];
    let from_state = body
        .instructions
        .iter()
        .find(|i| i.id() == token_in)
        .unwrap();
    assert_eq!(from_state.opcode(), "get-tuple-element");
    assert_eq!(from_state.0.int(instruction::TUPLE_INDEX), 1);
    let root = body
        .instructions
        .iter()
        .find(|i| i.id() == body.root_id())
        .unwrap();
    assert_eq!(root.shape().unwrap().elements().unwrap().len(), 2);
    let parameter = find(condition, "parameter")[0];
    assert!(parameter.shape().unwrap().elements().unwrap()[1].is_token());
    // The state's element is read by the psum alone: the call works in the loop's memory.
    assert!(call.0.has(instruction::OUTPUT_OPERAND_ALIASING));
}

#[test]
fn a_loop_state_element_read_twice_keeps_its_memory() {
    let x = array(F32, &[4]);
    let state = Shape::tuple(std::slice::from_ref(&x));
    let mut ar = all_reduce(21, &x);
    ar.0.set_int(instruction::ID, 22);
    let body = computation_of(
        2,
        "body",
        vec![
            parameter(20, 0, &state),
            Instruction::get_tuple_element(21, "element", &x, 20, 0),
            ar,
            // Another read of the same element, which the psum must not have overwritten.
            Instruction::get_tuple_element(24, "again", &x, 20, 0),
            Instruction::new(25, "sum", "add", &x, &[22, 24]),
            Instruction::new(23, "next", "tuple", &state, &[25]),
        ],
        23,
    );
    let condition = computation_of(
        3,
        "condition",
        vec![
            parameter(30, 0, &state),
            Instruction::new(31, "go", "constant", &array(1, &[]), &[]),
        ],
        31,
    );
    let mut lp = Instruction::new(4, "loop", "while", &state, &[5]);
    lp.0.set_ints(instruction::CALLED_COMPUTATION_IDS, &[2, 3]);
    let bytes = module_of(vec![
        entry(
            vec![
                parameter(2, 0, &x),
                Instruction::new(5, "init", "tuple", &state, &[2]),
                lp,
            ],
            4,
        ),
        adder(),
        body,
        condition,
    ]);
    let computations = rewritten(&bytes);
    let [call] = find(&computations[2], "custom-call")[..] else {
        panic!("one call")
    };
    assert!(!call.0.has(instruction::OUTPUT_OPERAND_ALIASING));
}

fn refusal_of(bytes: &[u8]) -> String {
    match rewrite_module(bytes) {
        Err(refusal) => refusal.to_string(),
        Ok(_) => panic!("the module was taken"),
    }
}

#[test]
fn asynchronous_collectives_are_refused_by_name() {
    let x = array(F32, &[4]);
    let mut start = all_reduce(2, &x);
    start.0.set_string(instruction::OPCODE, "all-reduce-start");
    let bytes = module_of(vec![entry(vec![parameter(2, 0, &x), start], 3), adder()]);
    let message = refusal_of(&bytes);
    assert!(
        message.contains("psum") && message.contains("all-reduce-start"),
        "{message}"
    );
    assert!(message.contains("gloo"), "{message}");
}

#[test]
fn a_collective_inside_a_called_computation_is_refused() {
    let x = array(F32, &[4]);
    let inner = computation_of(
        2,
        "inner",
        vec![parameter(20, 0, &x), {
            let mut ar = all_reduce(20, &x);
            ar.0.set_int(instruction::ID, 21);
            ar
        }],
        21,
    );
    let mut call = Instruction::new(3, "outer_call", "call", &x, &[2]);
    call.0.set_ints(instruction::CALLED_COMPUTATION_IDS, &[2]);
    let bytes = module_of(vec![
        entry(vec![parameter(2, 0, &x), call], 3),
        adder(),
        inner,
    ]);
    let message = refusal_of(&bytes);
    assert!(
        message.contains("outer_call") && message.contains("call"),
        "{message}"
    );
}

#[test]
fn groups_that_leave_a_device_out_are_refused() {
    let x = array(F32, &[4]);
    let mut ar = all_reduce(2, &x);
    let mut group = Message::default();
    group.set_ints(1, &[0]);
    let mut list = Message::default();
    list.push_message(1, &group);
    ar.0.set_message(instruction::COLLECTIVE_DEVICE_LIST, &list);
    let bytes = module_of(vec![entry(vec![parameter(2, 0, &x), ar], 3), adder()]);
    assert!(refusal_of(&bytes).contains("exactly once"));
}

#[test]
fn an_all_gather_whose_layouts_differ_is_refused() {
    let x = array(F32, &[2, 3]);
    let mut y = array(F32, &[4, 3]);
    let mut layout = Message::default();
    layout.set_ints(shape::MINOR_TO_MAJOR, &[0, 1]);
    y.0.set_message(shape::LAYOUT, &layout);
    let mut ag = all_reduce(2, &y);
    ag.0.set_string(instruction::OPCODE, "all-gather");
    ag.0.set_ints(instruction::DIMENSIONS, &[0]);
    let bytes = module_of(vec![entry(vec![parameter(2, 0, &x), ag], 3), adder()]);
    assert!(refusal_of(&bytes).contains("laid out in memory differently"));
}

#[test]
fn modules_without_collectives_are_left_alone() {
    let x = array(F32, &[4]);
    let bytes = module_of(vec![entry(vec![parameter(2, 0, &x)], 2)]);
    assert!(rewrite_module(&bytes).unwrap().is_none());
}

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
    let [call] = find(main, "custom-call")[..] else {
        panic!("one call")
    };
    assert_eq!(call.target(), "jaxmpi_hlo_all_to_all");
    let [token] = find(main, "after-all")[..] else {
        panic!("one fresh token")
    };
    assert_eq!(call.operands().unwrap(), vec![4, token.id()]);
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
    let [call] = find(main, "custom-call")[..] else {
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
    let [call] = find(main, "custom-call")[..] else {
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
    let [call] = find(main, "custom-call")[..] else {
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
    let [call] = find(main, "custom-call")[..] else {
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
    let condition = computation_of(
        3,
        "condition",
        vec![
            parameter(30, 0, &state),
            Instruction::new(31, "go", "constant", &array(1, &[]), &[]),
        ],
        31,
    );
    let mut lp = Instruction::new(4, "loop", "while", &state, &[5]);
    lp.0.set_ints(instruction::CALLED_COMPUTATION_IDS, &[2, 3]);
    let bytes = module_of(vec![
        entry(
            vec![
                parameter(2, 0, &whole),
                Instruction::new(5, "init", "tuple", &state, &[2]),
                lp,
            ],
            4,
        ),
        body,
        condition,
        c0,
        c1,
    ]);
    let computations = rewritten(&bytes);
    assert_eq!(computations.len(), 3, "the slices' computations are gone");
    let body = &computations[1];
    let [call] = find(body, "custom-call")[..] else {
        panic!("one call in the body")
    };
    let [copy] = find(body, "copy")[..] else {
        panic!("one copy")
    };
    assert_eq!(copy.operands().unwrap(), vec![21]);
    assert_eq!(call.operands().unwrap()[0], copy.id());
    assert!(find(body, "concatenate").is_empty() && find(body, "fusion").is_empty());
}
