//! The pass on small modules built here field by field, as XLA would hand them over: what
//! a collective becomes, where the token goes, when a result may take its operand's
//! memory, and each refusal. (The modules JAX really makes are run in
//! tests/python/test_jax_collectives.py.)

use super::pass::rewrite_module;
use super::proto::{computation, instruction, module, shape, Computation, Instruction, Shape};
use super::rewrite::PROLOGUE;
use super::wire::Message;

pub(super) fn array(element_type: i64, dims: &[i64]) -> Shape {
    let mut m = Message::default();
    m.set_int(shape::ELEMENT_TYPE, element_type);
    m.set_ints(shape::DIMENSIONS, dims);
    let mut layout = Message::default();
    let minor_to_major: Vec<i64> = (0..dims.len() as i64).rev().collect();
    layout.set_ints(shape::MINOR_TO_MAJOR, &minor_to_major);
    m.set_message(shape::LAYOUT, &layout);
    Shape(m)
}

pub(super) const F32: i64 = 11;

pub(super) fn parameter(id: i64, number: i64, shape: &Shape) -> Instruction {
    let mut p = Instruction::new(id, &format!("p{id}"), "parameter", shape, &[]);
    p.0.set_int(instruction::PARAMETER_NUMBER, number);
    p
}

pub(super) fn computation_of(
    id: i64,
    name: &str,
    instructions: Vec<Instruction>,
    root: i64,
) -> Vec<u8> {
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
pub(super) fn adder() -> Vec<u8> {
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
pub(super) fn module_of(computations: Vec<Vec<u8>>) -> Vec<u8> {
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

/// A psum of `operand` over both partitions, instruction 3 (the entry's, after its
/// parameter 2).
pub(super) fn all_reduce(operand: i64, shape: &Shape) -> Instruction {
    all_reduce_numbered(3, operand, shape)
}

/// The same psum as instruction `id` (inside a loop's or a branch's computation).
pub(super) fn all_reduce_numbered(id: i64, operand: i64, shape: &Shape) -> Instruction {
    let mut ar = Instruction::new(id, "psum", "all-reduce", shape, &[operand]);
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

pub(super) fn entry(instructions: Vec<Instruction>, root: i64) -> Vec<u8> {
    computation_of(0, "main", instructions, root)
}

pub(super) fn rewritten(bytes: &[u8]) -> Vec<Computation> {
    let done = rewrite_module(bytes).expect("rewritten").expect("changed");
    let m = Message::parse(&done.module).unwrap();
    m.all_bytes(module::COMPUTATIONS)
        .map(|c| Computation::parse(c).unwrap())
        .collect()
}

/// An entry running computation 2 (the body) in a while loop whose state is one `x`
/// (parameter 2, the loop instruction 4), and its condition, computation 3.
pub(super) fn loop_entry_and_condition(x: &Shape) -> (Vec<u8>, Vec<u8>) {
    let state = Shape::tuple(std::slice::from_ref(x));
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
    let entry = entry(
        vec![
            parameter(2, 0, x),
            Instruction::new(5, "init", "tuple", &state, &[2]),
            lp,
        ],
        4,
    );
    (entry, condition)
}

pub(super) fn find<'a>(c: &'a Computation, opcode: &str) -> Vec<&'a Instruction> {
    c.instructions
        .iter()
        .filter(|i| i.opcode() == opcode)
        .collect()
}

/// The custom calls of `c` that stand for collectives (the prologue left out).
pub(super) fn collectives(c: &Computation) -> Vec<&Instruction> {
    find(c, "custom-call")
        .into_iter()
        .filter(|i| i.target() != PROLOGUE)
        .collect()
}

/// The token the entry's prologue gives on, checking that the prologue takes the fresh
/// one, before every other MPI call.
pub(super) fn after_prologue(main: &Computation) -> i64 {
    let [token] = find(main, "after-all")[..] else {
        panic!("one fresh token")
    };
    let [prologue] = find(main, "custom-call")
        .into_iter()
        .filter(|i| i.target() == PROLOGUE)
        .collect::<Vec<_>>()[..]
    else {
        panic!("one prologue")
    };
    assert_eq!(prologue.operands().unwrap(), vec![token.id()]);
    let given = main
        .instructions
        .iter()
        .find(|i| i.opcode() == "get-tuple-element" && i.operands().unwrap() == [prologue.id()])
        .expect("the prologue's token taken out");
    given.id()
}

#[test]
fn a_program_begins_with_the_communicators_of_its_groups() {
    let x = array(F32, &[4]);
    let bytes = module_of(vec![
        entry(vec![parameter(2, 0, &x), all_reduce(2, &x)], 3),
        adder(),
    ]);
    let main = &rewritten(&bytes)[0];
    after_prologue(main);
    let prologue = find(main, "custom-call")
        .into_iter()
        .find(|i| i.target() == PROLOGUE)
        .unwrap();
    let config = prologue.0.string(instruction::BACKEND_CONFIG);
    assert_eq!(config, "{groups = dense<[2, 0, 2048]> : tensor<3xi64>}");
}

#[test]
fn a_permutes_devices_are_marked_in_the_prologue() {
    // A swap of the two partitions beside a psum over them: the same devices, listed
    // twice, the permute's with its size negative (its communicator is its processes').
    let x = array(F32, &[4]);
    let mut swap = Instruction::new(4, "ppermute", "collective-permute", &x, &[3]);
    swap.0.set_int(instruction::CHANNEL_ID, 2);
    for (source, target) in [(0, 1), (1, 0)] {
        let mut pair = Message::default();
        pair.set_int(1, source);
        pair.set_int(2, target);
        swap.0.push_message(instruction::SOURCE_TARGET_PAIRS, &pair);
    }
    let bytes = module_of(vec![
        entry(vec![parameter(2, 0, &x), all_reduce(2, &x), swap], 4),
        adder(),
    ]);
    let main = &rewritten(&bytes)[0];
    let prologue = find(main, "custom-call")
        .into_iter()
        .find(|i| i.target() == PROLOGUE)
        .unwrap();
    let config = prologue.0.string(instruction::BACKEND_CONFIG);
    assert_eq!(
        config,
        "{groups = dense<[2, 0, 2048, -2, 0, 2048]> : tensor<6xi64>}"
    );
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
    let [call] = collectives(main)[..] else {
        panic!("one call")
    };
    assert_eq!(call.target(), "jaxmpi_hlo_all_reduce");
    let config = call.0.string(instruction::BACKEND_CONFIG);
    assert!(
        config.contains("groups = dense<[2, 0, 2048]> : tensor<3xi64>"),
        "{config}"
    );
    assert!(config.contains("op = 0 : i64"), "{config}");
    assert_eq!(call.operands().unwrap(), vec![2, after_prologue(main)]);
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
    let [call] = collectives(main)[..] else {
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
    let [call] = collectives(main)[..] else {
        panic!("one call")
    };
    assert!(!call.0.has(instruction::OUTPUT_OPERAND_ALIASING));
}

#[test]
fn the_token_goes_through_a_loop_state() {
    let x = array(F32, &[4]);
    let state = Shape::tuple(std::slice::from_ref(&x));
    // Body (computation 2): psum of the state's element, back into a tuple.
    let body = computation_of(
        2,
        "body",
        vec![
            parameter(20, 0, &state),
            Instruction::get_tuple_element(21, "element", &x, 20, 0),
            all_reduce_numbered(22, 21, &x),
            Instruction::new(23, "next", "tuple", &state, &[22]),
        ],
        23,
    );
    let (entry, condition) = loop_entry_and_condition(&x);
    let bytes = module_of(vec![entry, adder(), body, condition]);
    let computations = rewritten(&bytes);
    let (main, body, condition) = (&computations[0], &computations[2], &computations[3]);
    let [while_loop] = find(main, "while")[..] else {
        panic!("one loop")
    };
    let elements = while_loop.shape().unwrap().elements().unwrap();
    assert_eq!(elements.len(), 2);
    assert!(elements[1].is_token());
    // The body takes the token from its state, gives it to the call, and puts back
    // the call's.
    let [call] = collectives(body)[..] else {
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
    let ar = all_reduce_numbered(22, 21, &x);
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
    let (entry, condition) = loop_entry_and_condition(&x);
    let bytes = module_of(vec![entry, adder(), body, condition]);
    let computations = rewritten(&bytes);
    let [call] = collectives(&computations[2])[..] else {
        panic!("one call")
    };
    assert!(!call.0.has(instruction::OUTPUT_OPERAND_ALIASING));
}

pub(super) fn refusal_of(bytes: &[u8]) -> String {
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
        vec![parameter(20, 0, &x), all_reduce_numbered(21, 20, &x)],
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
