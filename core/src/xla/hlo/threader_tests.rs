//! The token through nested control flow (`threader.rs`), on modules built field by
//! field: loops and conditionals whose results, parameters or roots other instructions
//! take whole keep the shapes those instructions read, and every loop and branch takes
//! and gives the shapes its caller passes (what XLA's verifier checks after the pass).

use std::collections::HashMap;

use super::proto::{instruction, Computation, Instruction, Shape};
use super::tests::{
    adder, all_reduce_numbered, array, computation_of, entry, module_of, parameter, rewritten, F32,
};

const PRED: i64 = 1;

/// Every conditional and loop of `computations` passes each called computation a
/// parameter of its own shape, and gets back its result's shape.
fn shapes_agree(computations: &[Computation]) {
    let by_id: HashMap<i64, &Computation> = computations.iter().map(|c| (c.id(), c)).collect();
    let root = |c: &Computation| {
        let root = c.instructions.iter().find(|i| i.id() == c.root_id());
        root.expect("a root").shape().unwrap()
    };
    let parameter = |c: &Computation| {
        let p = c.instructions.iter().find(|i| i.opcode() == "parameter");
        p.expect("a parameter").shape().unwrap()
    };
    for c in computations {
        let shape_of: HashMap<i64, Shape> = c
            .instructions
            .iter()
            .map(|i| (i.id(), i.shape().unwrap()))
            .collect();
        for inst in &c.instructions {
            let called = inst.called().unwrap();
            let operands = inst.operands().unwrap();
            let (passed, returns): (Vec<i64>, bool) = match inst.opcode().as_str() {
                "conditional" => (operands[1..].to_vec(), true),
                "while" => (vec![operands[0]; 2], false),
                _ => continue,
            };
            for (k, id) in called.iter().enumerate() {
                let callee = by_id[id];
                let given = &shape_of[&passed[k]];
                assert_eq!(
                    parameter(callee).0.encode(),
                    given.0.encode(),
                    "{} into {}",
                    inst.name(),
                    callee.name()
                );
                let back = if returns || k == 0 {
                    inst.shape().unwrap()
                } else {
                    continue;
                };
                assert_eq!(
                    root(callee).0.encode(),
                    back.0.encode(),
                    "{} from {}",
                    inst.name(),
                    callee.name()
                );
            }
        }
    }
}

/// A conditional on `predicate`, `operand` given to both branches.
fn conditional(
    id: i64,
    shape: &Shape,
    predicate: i64,
    operand: i64,
    branches: [i64; 2],
) -> Instruction {
    let mut c = Instruction::new(
        id,
        &format!("cond{id}"),
        "conditional",
        shape,
        &[predicate, operand, operand],
    );
    c.0.set_ints(instruction::CALLED_COMPUTATION_IDS, &branches);
    c
}

#[test]
fn branches_that_take_their_state_whole_and_return_a_conditional_keep_their_shapes() {
    let x = array(F32, &[4]);
    let state = Shape::tuple(std::slice::from_ref(&x));
    let flag = array(PRED, &[]);
    // Entry: cond6(flag, (x)) over branches 7 and 8.
    let main = entry(
        vec![
            parameter(2, 0, &x),
            parameter(3, 1, &flag),
            Instruction::new(5, "state", "tuple", &state, &[2]),
            conditional(6, &state, 3, 5, [7, 8]),
            Instruction::get_tuple_element(9, "out", &x, 6, 0),
        ],
        9,
    );
    // Branch 7: its whole state into an inner conditional over 10 and 11, its root.
    let outer_a = computation_of(
        7,
        "outer_a",
        vec![
            parameter(70, 0, &state),
            Instruction::new(71, "flag", "constant", &flag, &[]),
            conditional(72, &state, 71, 70, [10, 11]),
        ],
        72,
    );
    // Branch 8: its state back, whole.
    let outer_b = computation_of(8, "outer_b", vec![parameter(80, 0, &state)], 80);
    // Inner branch 10: a psum of the element; 11: the state back.
    let inner_a = computation_of(
        10,
        "inner_a",
        vec![
            parameter(100, 0, &state),
            Instruction::get_tuple_element(101, "element", &x, 100, 0),
            all_reduce_numbered(102, 101, &x),
            Instruction::new(103, "back", "tuple", &state, &[102]),
        ],
        103,
    );
    let inner_b = computation_of(11, "inner_b", vec![parameter(110, 0, &state)], 110);
    let bytes = module_of(vec![main, adder(), outer_a, outer_b, inner_a, inner_b]);
    let computations = rewritten(&bytes);
    shapes_agree(&computations);
    // The entry's reader of the conditional's element still reads the element.
    let main = &computations[0];
    let out = main.instructions.iter().find(|i| i.id() == 9).unwrap();
    assert_eq!(out.shape().unwrap().0.encode(), x.0.encode());
}
