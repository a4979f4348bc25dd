//! What each XLA collective becomes: the `jaxmpi_hlo_*` handler it calls and the
//! attributes that handler reads (its devices' groups, the reduction, the physical layout
//! of the dimension it works along), and whether its result may take the operand's
//! memory (`in_place.rs` decides). `order.rs` then puts the calls in the module, in one order; `pass.rs` runs the
//! two on a whole module.

use std::collections::HashMap;

use super::config::Config;
use super::groups::{self, DeviceAssignment, Mode};
use super::in_place::{may_take_operand_memory, uses_in};
use super::proto::{instruction, Computation, Instruction, Shape};
use super::Refusal;
use crate::xla::mesh::connected;
use crate::{Dtype, ReduceOp};

/// The handlers the pass calls, by HLO opcode.
pub const TARGETS: [(&str, &str); 6] = [
    ("all-reduce", "jaxmpi_hlo_all_reduce"),
    ("all-gather", "jaxmpi_hlo_all_gather"),
    ("reduce-scatter", "jaxmpi_hlo_reduce_scatter"),
    ("all-to-all", "jaxmpi_hlo_all_to_all"),
    ("collective-permute", "jaxmpi_hlo_collective_permute"),
    ("ragged-all-to-all", "jaxmpi_hlo_ragged_all_to_all"),
];

/// The handler of a program's prologue, which makes the communicators its collectives run
/// on (`threader.rs` puts it first).
pub const PROLOGUE: &str = "jaxmpi_hlo_communicators";

/// XLA's other ways of communicating, which this pass does not take: a module holding
/// one is refused whole.
const OTHER_COMMUNICATION: [&str; 12] = [
    "all-reduce-start",
    "all-reduce-done",
    "all-gather-start",
    "all-gather-done",
    "collective-permute-start",
    "collective-permute-done",
    "collective-broadcast",
    "send",
    "send-done",
    "recv",
    "recv-done",
    "async-start",
];

/// A collective as a call: its handler, attributes, the results that take their
/// operand's memory (`(result index, operand index)`), and the groups of devices it runs
/// among (a permute's: the devices its pairs connect), whose communicators the program's
/// prologue makes.
pub struct Call {
    pub target: &'static str,
    pub config: Config,
    pub aliases: Vec<(usize, usize)>,
    pub groups: Vec<Vec<i64>>,
}

pub fn target_of(opcode: &str) -> Option<&'static str> {
    TARGETS
        .iter()
        .find(|(op, _)| *op == opcode)
        .map(|(_, t)| *t)
}

pub fn refusal(inst: &Instruction, reason: impl Into<String>) -> Refusal {
    Refusal::at(inst.name(), inst.op_name(), reason)
}

/// Whether an instruction is a collective this pass replaces, one it refuses, or neither.
pub enum Kind {
    Collective,
    Refused,
    Other,
}

pub fn kind(inst: &Instruction) -> Kind {
    let opcode = inst.opcode();
    if target_of(&opcode).is_some() {
        Kind::Collective
    } else if OTHER_COMMUNICATION.contains(&opcode.as_str()) {
        Kind::Refused
    } else {
        Kind::Other
    }
}

/// XLA's element type as jaxmpi's.
fn dtype(element_type: i64) -> Option<Dtype> {
    Some(match element_type {
        1 => Dtype::Bool,
        2 => Dtype::I8,
        3 => Dtype::I16,
        4 => Dtype::I32,
        5 => Dtype::I64,
        6 => Dtype::U8,
        7 => Dtype::U16,
        8 => Dtype::U32,
        9 => Dtype::U64,
        10 => Dtype::F16,
        11 => Dtype::F32,
        12 => Dtype::F64,
        15 => Dtype::C64,
        16 => Dtype::BF16,
        18 => Dtype::C128,
        _ => return None,
    })
}

/// The arrays a collective takes or gives: the elements of a tuple shape, or the shape.
fn arrays(shape: &Shape) -> Result<Vec<Shape>, Refusal> {
    Ok(if shape.is_tuple() {
        shape.elements()?
    } else {
        vec![shape.clone()]
    })
}

fn check_dtypes(inst: &Instruction, shapes: &[Shape]) -> Result<(), Refusal> {
    for shape in shapes {
        if dtype(shape.element_type()).is_none() {
            return Err(refusal(
                inst,
                format!(
                    "its element type (XLA type {}) is none jaxmpi moves (bool, ints, \
                     floats of 16 to 64 bits, complex)",
                    shape.element_type()
                ),
            ));
        }
    }
    Ok(())
}

/// The reduction of a collective's `to_apply` computation, for its element type.
fn reduction(
    inst: &Instruction,
    computations: &HashMap<i64, &Computation>,
    element: Dtype,
) -> Result<ReduceOp, Refusal> {
    let called = inst.called()?;
    let reducer = called
        .first()
        .and_then(|id| computations.get(id))
        .ok_or_else(|| refusal(inst, "it names no reduction computation"))?;
    let root = reducer
        .instructions
        .iter()
        .find(|i| i.id() == reducer.root_id())
        .ok_or_else(|| refusal(inst, "its reduction computation has no root"))?;
    let parameters: Vec<i64> = reducer
        .instructions
        .iter()
        .filter(|i| i.opcode() == "parameter")
        .map(Instruction::id)
        .collect();
    let mut operands = root.operands()?;
    operands.sort_unstable();
    let mut expected = parameters.clone();
    expected.sort_unstable();
    let binary = operands.len() == 2 && parameters.len() == 2 && operands == expected;
    let logical = element == Dtype::Bool;
    let op = match (root.opcode().as_str(), logical) {
        _ if !binary => None,
        ("add", false) => Some(ReduceOp::Sum),
        ("multiply", false) => Some(ReduceOp::Prod),
        ("minimum", false) => Some(ReduceOp::Min),
        ("maximum", false) => Some(ReduceOp::Max),
        ("minimum" | "and" | "multiply", true) => Some(ReduceOp::Land),
        ("maximum" | "or" | "add", true) => Some(ReduceOp::Lor),
        ("xor", true) => Some(ReduceOp::Lxor),
        ("and", false) => Some(ReduceOp::Band),
        ("or", false) => Some(ReduceOp::Bor),
        ("xor", false) => Some(ReduceOp::Bxor),
        _ => None,
    };
    match op {
        Some(op) if op.supports(element) => Ok(op),
        _ => Err(refusal(
            inst,
            format!(
                "its reduction ({} of {element}) is none of MPI's (sum, product, min, max, \
                 and, or, xor)",
                root.opcode()
            ),
        )),
    }
}

/// The reduction's portable code (`ReduceOp::PREDEFINED`'s index), as the handlers decode it.
fn op_code(op: ReduceOp) -> i64 {
    ReduceOp::PREDEFINED
        .iter()
        .position(|p| *p == op)
        .map_or(-1, |i| i as i64)
}

/// Groups as the handlers read them: each group's size, then its devices.
/// A group whose communicators a program's prologue makes: a collective's devices, or a
/// permute's connected devices (`permute`: its messages go on the communicator of their
/// processes, `mesh::Kind::Permute`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Among {
    pub devices: Vec<i64>,
    pub permute: bool,
}

/// The prologue's list: each group's size (negative for a permute's), then its devices.
pub fn encode_prologue(groups: &[Among]) -> Vec<i64> {
    let mut flat = Vec::new();
    for group in groups {
        let size = group.devices.len() as i64;
        flat.push(if group.permute { -size } else { size });
        flat.extend_from_slice(&group.devices);
    }
    flat
}

pub fn encode_groups(groups: &[Vec<i64>]) -> Vec<i64> {
    let mut flat = Vec::new();
    for group in groups {
        flat.push(group.len() as i64);
        flat.extend_from_slice(group);
    }
    flat
}

/// How many slices lie outside `dim` in memory: the product of the dimensions more major
/// than it in the layout. The collective's blocks along `dim` are contiguous within a
/// slice; with one slice, the whole array is its blocks back to back.
fn outer_slices(shape: &Shape, dim: usize) -> Result<i64, Refusal> {
    let dims = shape.dims()?;
    let order = shape.major_to_minor()?;
    let mut outer = 1;
    for d in order {
        if d == dim {
            return Ok(outer);
        }
        outer *= dims[d];
    }
    Err(Refusal::module(format!(
        "dimension {dim} is not in a shape of rank {}",
        dims.len()
    )))
}

/// The one dimension a collective works along, with its operand and result laid out alike.
fn along(inst: &Instruction, operand: &Shape, result: &Shape) -> Result<usize, Refusal> {
    let dims = inst.0.ints(instruction::DIMENSIONS)?;
    let [dim] = dims[..] else {
        return Err(refusal(
            inst,
            format!("it works along dimensions {dims:?}, not one"),
        ));
    };
    if operand.major_to_minor()? != result.major_to_minor()? {
        return Err(refusal(
            inst,
            "its operand and result are laid out in memory differently",
        ));
    }
    Ok(dim as usize)
}

/// What `inst` (a collective) becomes in `computation`.
pub fn translate(
    inst: &Instruction,
    computation: &Computation,
    assignment: &DeviceAssignment,
    computations: &HashMap<i64, &Computation>,
    loop_body: bool,
) -> Result<Call, Refusal> {
    let opcode = inst.opcode();
    let target = target_of(&opcode).unwrap_or_default();
    let operand_ids = inst.operands()?;
    let by_id: HashMap<i64, &Instruction> = computation
        .instructions
        .iter()
        .map(|i| (i.id(), i))
        .collect();
    let operand_shapes = operand_ids
        .iter()
        .map(|id| {
            by_id
                .get(id)
                .ok_or_else(|| refusal(inst, format!("operand {id} is not in its computation")))
                .and_then(|o| Ok(o.shape()?))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let results = arrays(&inst.shape()?)?;
    check_dtypes(inst, &results)?;
    check_dtypes(inst, &operand_shapes)?;
    let grouped = |has_flag: bool| -> Result<Vec<Vec<i64>>, Refusal> {
        let logical = groups::logical_groups(&inst.0).map_err(|e| refusal(inst, e))?;
        groups::device_groups(&logical, Mode::of(&inst.0, has_flag), assignment)
            .map_err(|e| refusal(inst, e))
    };
    let config = Config::default().text("origin", &inst.op_name());
    let mut aliases = Vec::new();
    let mut among = Vec::new();
    let config = match opcode.as_str() {
        "all-reduce" => {
            let groups = grouped(true)?;
            among.clone_from(&groups);
            let element = dtype(results[0].element_type()).unwrap_or(Dtype::U8);
            let op = reduction(inst, computations, element)?;
            let uses = uses_in(computation);
            for (k, id) in operand_ids.iter().enumerate() {
                let once = operand_ids.iter().filter(|o| *o == id).count() == 1;
                if once && may_take_operand_memory(by_id[id], &uses, computation, loop_body) {
                    aliases.push((k, k));
                }
            }
            config
                .ints("groups", &encode_groups(&groups))
                .int("op", op_code(op))
        }
        "all-gather" | "reduce-scatter" => {
            let groups = grouped(true)?;
            among.clone_from(&groups);
            let size = groups.first().map_or(1, Vec::len) as i64;
            if groups.iter().any(|g| g.len() as i64 != size) {
                return Err(refusal(inst, "its groups are of different sizes"));
            }
            let mut outer = Vec::new();
            for (operand, result) in operand_shapes.iter().zip(&results) {
                let dim = along(inst, operand, result)?;
                let (whole, part) = match opcode.as_str() {
                    "all-gather" => (result, operand),
                    _ => (operand, result),
                };
                if whole.dims()?[dim] != size * part.dims()?[dim] {
                    return Err(refusal(inst, "its shapes do not match its group size"));
                }
                outer.push(outer_slices(whole, dim)?);
            }
            let config = config
                .ints("groups", &encode_groups(&groups))
                .ints("outer", &outer);
            if opcode == "reduce-scatter" {
                let element = dtype(results[0].element_type()).unwrap_or(Dtype::U8);
                let op = reduction(inst, computations, element)?;
                config.int("op", op_code(op))
            } else {
                config
            }
        }
        "all-to-all" => {
            let groups = grouped(false)?;
            among.clone_from(&groups);
            let size = groups.first().map_or(1, Vec::len);
            if groups.iter().any(|g| g.len() != size) {
                return Err(refusal(inst, "its groups are of different sizes"));
            }
            let outer = if inst.0.has(instruction::DIMENSIONS) {
                let dim = along(inst, &operand_shapes[0], &results[0])?;
                if operand_shapes[0].dims()?[dim] % size as i64 != 0 {
                    return Err(refusal(
                        inst,
                        "its split dimension does not divide by the group",
                    ));
                }
                vec![outer_slices(&operand_shapes[0], dim)?]
            } else if operand_shapes.len() == size {
                Vec::new()
            } else {
                return Err(refusal(
                    inst,
                    "it has neither one array per group member nor a split dimension",
                ));
            };
            config
                .ints("groups", &encode_groups(&groups))
                .ints("outer", &outer)
        }
        "collective-permute" => {
            if operand_ids.len() != 1 {
                return Err(refusal(
                    inst,
                    "it permutes several arrays in one instruction",
                ));
            }
            let mode = if inst.0.int(instruction::CHANNEL_ID) > 0 {
                Mode::CrossPartition
            } else {
                Mode::CrossReplica
            };
            let pairs =
                groups::device_pairs(&inst.0, mode, assignment).map_err(|e| refusal(inst, e))?;
            let flat: Vec<i64> = pairs.iter().flat_map(|&(s, t)| [s, t]).collect();
            among = connected(&flat);
            config.ints("pairs", &flat)
        }
        "ragged-all-to-all" => {
            let groups = grouped(false)?;
            among.clone_from(&groups);
            if operand_ids.len() != 6 {
                return Err(refusal(
                    inst,
                    "it does not have ragged-all-to-all's six operands",
                ));
            }
            for shape in &operand_shapes[..2] {
                if shape.major_to_minor()?.first().is_some_and(|&d| d != 0) {
                    return Err(refusal(inst, "its rows are not contiguous in memory"));
                }
            }
            let uses = uses_in(computation);
            let output = by_id[&operand_ids[1]];
            if may_take_operand_memory(output, &uses, computation, loop_body) {
                aliases.push((0, 1));
            }
            config.ints("groups", &encode_groups(&groups))
        }
        _ => return Err(refusal(inst, "it is no collective jaxmpi knows")),
    };
    Ok(Call {
        target,
        config,
        aliases,
        groups: among,
    })
}
