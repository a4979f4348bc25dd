//! Whether a collective's result may take its operand's memory (the handler then reduces
//! in place, and XLA allocates no result): only where nothing else can see the operand.
//! `rewrite.rs` asks for each collective it translates, `tiled.rs` for the arrays it
//! takes back from XLA's split of a tiled all-to-all.

use std::collections::HashMap;

use super::proto::{instruction, Computation, Instruction};

/// How many times each instruction is an operand in `computation`, the root counting once.
pub fn uses_in(computation: &Computation) -> HashMap<i64, usize> {
    let mut uses: HashMap<i64, usize> = HashMap::new();
    for inst in &computation.instructions {
        for operand in inst.operands().unwrap_or_default() {
            *uses.entry(operand).or_default() += 1;
        }
    }
    *uses.entry(computation.root_id()).or_default() += 1;
    for inst in &computation.instructions {
        uses.entry(inst.id()).or_default();
    }
    uses
}

/// Whether the result may be written into the operand's memory: only where nothing else
/// can see it. Copy insertion has already run, so an operand that is a parameter, a
/// constant, a view of another value (tuple element, bitcast) or a copy XLA may still
/// remove, one used elsewhere too, or the computation's result, must keep its contents.
/// One view is safe: an element of a loop body's state that nothing else in the body
/// reads. The state is the loop's own (copy insertion gave the loop a copy of what it
/// started from), and the body's result replaces it anyway.
pub fn may_take_operand_memory(
    operand: &Instruction,
    uses: &HashMap<i64, usize>,
    computation: &Computation,
    loop_body: bool,
) -> bool {
    const SHARED: [&str; 6] = [
        "parameter",
        "get-tuple-element",
        "constant",
        "tuple",
        "bitcast",
        "copy",
    ];
    if uses[&operand.id()] != 1 || operand.id() == computation.root_id() {
        return false;
    }
    if operand.opcode() == "get-tuple-element" {
        return loop_body && only_reader_of_its_state_element(operand, uses, computation);
    }
    !SHARED.contains(&operand.opcode().as_str())
}

/// Whether `element` (a get-tuple-element) reads a loop body's parameter, whose other uses
/// are all reads of other elements.
fn only_reader_of_its_state_element(
    element: &Instruction,
    uses: &HashMap<i64, usize>,
    computation: &Computation,
) -> bool {
    let (Ok(of), index) = (element.operands(), element.0.int(instruction::TUPLE_INDEX)) else {
        return false;
    };
    let Some(parameter) = computation.instructions.iter().find(|i| of == [i.id()]) else {
        return false;
    };
    if parameter.opcode() != "parameter" || parameter.id() == computation.root_id() {
        return false;
    }
    let mut readers = 0;
    for inst in &computation.instructions {
        if !inst
            .operands()
            .unwrap_or_default()
            .contains(&parameter.id())
        {
            continue;
        }
        if inst.opcode() != "get-tuple-element" {
            return false; // the whole state is read (or handed on)
        }
        if inst.0.int(instruction::TUPLE_INDEX) == index {
            readers += 1 + usize::from(uses[&inst.id()] == 0);
        }
    }
    readers == 1
}
