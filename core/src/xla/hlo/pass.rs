//! The pass on one module: its computations parsed, the tiled all-to-alls XLA took apart
//! put back together (`tiled.rs`), each collective translated into a jaxmpi call
//! (`rewrite.rs`), one token threaded through every MPI call (`order.rs`), the module
//! encoded again with every field it did not touch.

use super::groups::DeviceAssignment;
use super::order::Module;
use super::proto::{module, Computation};
use super::rewrite::{refusal, translate};
use super::threader;
use super::tiled;
use super::wire::{Field, Message, Value};
use super::Refusal;

/// The result of the pass on one module.
pub struct Rewritten {
    /// The new module, serialized.
    pub module: Vec<u8>,
    /// How many collectives now call jaxmpi.
    pub collectives: usize,
}

/// Whether a module can hold a collective at all (the pass sees every CPU module; most
/// hold none, and this costs a scan of the bytes, not a parse).
fn mentions_collective(bytes: &[u8]) -> bool {
    const NEEDLES: [&[u8]; 5] = [
        b"all-reduce",
        b"all-gather",
        b"reduce-scatter",
        b"all-to-all",
        b"collective-",
    ];
    NEEDLES
        .iter()
        .any(|needle| bytes.windows(needle.len()).any(|w| w == *needle))
}

/// Rewrites every collective of `bytes` (a serialized `HloModuleProto`) into jaxmpi calls;
/// `None` when it has none.
pub fn rewrite_module(bytes: &[u8]) -> Result<Option<Rewritten>, Refusal> {
    if !mentions_collective(bytes) {
        return Ok(None);
    }
    let mut whole = Message::parse(bytes)?;
    if whole.has(module::SCHEDULE) {
        return Err(Refusal::module(
            "the module is already scheduled (the pass must run before XLA's scheduler)",
        ));
    }
    let mut computations = whole
        .all_bytes(module::COMPUTATIONS)
        .map(Computation::parse)
        .collect::<Result<Vec<_>, _>>()?;
    let assignment = DeviceAssignment::of_module(&whole)?;
    let entry = whole.int(module::ENTRY_COMPUTATION_ID);
    if let Some(assignment) = assignment.as_ref() {
        let donates = [module::INPUT_OUTPUT_ALIAS, module::BUFFER_DONOR]
            .iter()
            .any(|&f| matches!(whole.message(f), Ok(Some(m)) if m.has(1)));
        let entry = tiled::Entry { id: entry, donates };
        tiled::reassemble(&mut computations, assignment, &entry);
    }
    let entry = whole.int(module::ENTRY_COMPUTATION_ID);
    let mut program = Module::new(computations, entry)?;
    let calls = program.translate(|inst, computation, all, loop_body| {
        let Some(assignment) = assignment.as_ref() else {
            return Err(refusal(inst, "the module has no device assignment"));
        };
        translate(inst, computation, assignment, all, loop_body)
    })?;
    if calls.is_empty() {
        return Ok(None);
    }
    let calling = program.calling_mpi_in_order(&calls)?;
    let groups = program.groups_in_order(&calls);
    threader::thread(&mut program, &calls, &calling, &groups)?;
    let at = whole
        .fields
        .iter()
        .position(|f| f.number == module::COMPUTATIONS)
        .unwrap_or(whole.fields.len());
    whole.remove(module::COMPUTATIONS);
    let encoded: Vec<_> = program
        .into_computations()
        .iter()
        .map(|c| Field {
            number: module::COMPUTATIONS,
            value: Value::Bytes(c.encode()),
        })
        .collect();
    whole.fields.splice(at..at, encoded);
    Ok(Some(Rewritten {
        module: whole.encode(),
        collectives: calls.len(),
    }))
}
