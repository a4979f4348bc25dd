//! JAX's tiled `all_to_all` as one array all-to-all again. XLA takes an all-to-all along a
//! dimension apart before the pass sees it: a slice of the array per group member (on CPU a
//! fusion wrapping the slice), a tuple all-to-all of the slices, and a concatenate of its
//! results along the same dimension (on CPU from jaxlib 0.12.1 on, a fusion wrapping the
//! concatenate). Run as that, every call copies the array twice more
//! than MPI_Alltoall on the array itself (into the slices, out to the concatenate).
//!
//! This finds exactly that, and puts back the all-to-all it came from: one instruction on
//! the array, split along that dimension (`dimensions`), giving the concatenate's shape
//! under the concatenate's id (so its users and the root need no change), where the tuple
//! all-to-all stood (so the MPI calls keep their order). `rewrite.rs` then hands it to
//! jaxmpi as any array all-to-all. Anything short of the exact pattern stays as it is, and
//! its tuple all-to-all is taken as such.
//!
//! Copy insertion has run, on the slices: where XLA must put the result in the array's own
//! memory (a loop's state element given back, a donated argument), the new call reads a
//! copy of the array, as copy insertion would have made (MPI cannot send from and receive
//! into one buffer).

use std::collections::{HashMap, HashSet};

use super::groups::{self, DeviceAssignment, Mode};
use super::in_place::uses_in;
use super::proto::{instruction, slice, Computation, Instruction};

/// One tuple all-to-all between slices and a concatenate, to become one array all-to-all.
struct Found {
    all_to_all: i64,
    /// The array the slices cut.
    array: i64,
    dim: usize,
    /// The get-tuple-elements of the all-to-all's results, in order.
    pieces: Vec<i64>,
    concatenate: i64,
    /// The slices nothing else reads, with the computations they call (a fusion's).
    unread: Vec<(i64, Vec<i64>)>,
    /// The computations the concatenate calls (a fusion's), gone with it.
    concatenate_calls: Vec<i64>,
    /// Whether the call reads a copy of the array (see `Context::may_be_the_result`).
    copy: bool,
}

/// What of the module decides where a computation's parameters live.
pub struct Entry {
    pub id: i64,
    /// Whether the module lets a parameter of it share memory with its result (donation).
    pub donates: bool,
}

/// Puts back every tiled all-to-all of `computations`; returns how many. Drops the
/// computations of the slices' fusions that nothing calls any more.
pub fn reassemble(
    computations: &mut Vec<Computation>,
    assignment: &DeviceAssignment,
    entry: &Entry,
) -> usize {
    let found: Vec<(usize, Vec<Found>)> = {
        let all: HashMap<i64, &Computation> = computations.iter().map(|c| (c.id(), c)).collect();
        computations
            .iter()
            .enumerate()
            .map(|(k, c)| (k, find(c, &all, assignment, entry)))
            .filter(|(_, f)| !f.is_empty())
            .collect()
    };
    let mut names: HashSet<String> = computations
        .iter()
        .flat_map(|c| c.instructions.iter().map(Instruction::name))
        .collect();
    let mut count = 0;
    let mut orphaned = HashSet::new();
    for (k, founds) in found {
        for f in &founds {
            orphaned.extend(
                f.unread
                    .iter()
                    .flat_map(|(_, called)| called.iter().copied()),
            );
            orphaned.extend(&f.concatenate_calls);
        }
        count += founds.len();
        apply(&mut computations[k], &founds, &mut names);
    }
    if !orphaned.is_empty() {
        let still_called: HashSet<i64> = computations
            .iter()
            .flat_map(|c| &c.instructions)
            .flat_map(|i| i.called().unwrap_or_default())
            .collect();
        computations.retain(|c| !orphaned.contains(&c.id()) || still_called.contains(&c.id()));
    }
    count
}

/// The tiled all-to-alls of one computation.
fn find(
    computation: &Computation,
    all: &HashMap<i64, &Computation>,
    assignment: &DeviceAssignment,
    entry: &Entry,
) -> Vec<Found> {
    let by_id: HashMap<i64, &Instruction> = computation
        .instructions
        .iter()
        .map(|i| (i.id(), i))
        .collect();
    let uses = uses_in(computation);
    let mut users: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut ordered = HashSet::new(); // ids in a control dependency, either side
    for inst in &computation.instructions {
        for operand in inst.operands().unwrap_or_default() {
            users.entry(operand).or_default().push(inst.id());
        }
        let predecessors = inst
            .0
            .ints(instruction::CONTROL_PREDECESSOR_IDS)
            .unwrap_or_default();
        if !predecessors.is_empty() {
            ordered.insert(inst.id());
            ordered.extend(predecessors);
        }
    }
    let context = Context {
        computation,
        all,
        by_id,
        uses,
        users,
        ordered,
        entry,
    };
    computation
        .instructions
        .iter()
        .filter(|i| i.opcode() == "all-to-all" && !i.0.has(instruction::DIMENSIONS))
        .filter_map(|i| context.tiled(i, assignment))
        .collect()
}

struct Context<'a> {
    computation: &'a Computation,
    all: &'a HashMap<i64, &'a Computation>,
    by_id: HashMap<i64, &'a Instruction>,
    uses: HashMap<i64, usize>,
    users: HashMap<i64, Vec<i64>>,
    ordered: HashSet<i64>,
    entry: &'a Entry,
}

/// One dimension of a slice: `[start, limit)` with a stride.
type Range = (i64, i64, i64);

impl Context<'_> {
    /// Whether `id` may go away or change: no root, no control dependency.
    fn free(&self, id: i64) -> bool {
        id != self.computation.root_id() && !self.ordered.contains(&id)
    }

    /// `a` (a tuple all-to-all) as a tiled one, if it is exactly that.
    fn tiled(&self, a: &Instruction, assignment: &DeviceAssignment) -> Option<Found> {
        let operands = a.operands().ok()?;
        let n = operands.len();
        if n < 2 || !self.free(a.id()) || a.shape().ok()?.elements().ok()?.len() != n {
            return None;
        }
        // One operand per member of each group (the array form splits in as many blocks).
        let logical = groups::logical_groups(&a.0).ok()?;
        let devices = groups::device_groups(&logical, Mode::of(&a.0, false), assignment).ok()?;
        if devices.is_empty() || devices.iter().any(|g| g.len() != n) {
            return None;
        }
        // Its results: read each once, in order, by one concatenate alone.
        let readers = self.users.get(&a.id())?;
        if readers.len() != n || self.uses[&a.id()] != n {
            return None;
        }
        let mut pieces = vec![None; n];
        for &r in readers {
            let gte = self.by_id[&r];
            let index = gte.0.int(instruction::TUPLE_INDEX);
            if gte.opcode() != "get-tuple-element" || !(0..n as i64).contains(&index) {
                return None;
            }
            if pieces[index as usize].replace(r).is_some() || self.uses[&r] != 1 || !self.free(r) {
                return None;
            }
        }
        let pieces: Vec<i64> = pieces.into_iter().collect::<Option<_>>()?;
        let &[c] = &self.users.get(&pieces[0])?[..] else {
            return None;
        };
        let concatenate = self.by_id[&c];
        let (dims, concatenate_calls) = self.concatenation(concatenate)?;
        if concatenate.operands().ok()? != pieces || dims.len() != 1 || self.ordered.contains(&c) {
            return None;
        }
        let dim = dims[0] as usize;
        // Its operands: slices of one array along `dim`, block i for member i.
        let cuts = operands
            .iter()
            .map(|o| self.slice_of(self.by_id.get(o)?))
            .collect::<Option<Vec<_>>>()?;
        let array = cuts[0].0;
        let whole = self.by_id.get(&array)?.shape().ok()?;
        let result = concatenate.shape().ok()?;
        let extent = whole.dims().ok()?;
        if whole.is_tuple()
            || result.dims().ok()? != extent
            || result.element_type() != whole.element_type()
            || result.major_to_minor().ok()? != whole.major_to_minor().ok()?
            || dim >= extent.len()
            || extent[dim] % n as i64 != 0
        {
            return None;
        }
        let block = extent[dim] / n as i64;
        for (i, (of, ranges, _)) in cuts.iter().enumerate() {
            if *of != array || ranges.len() != extent.len() {
                return None;
            }
            for (k, &range) in ranges.iter().enumerate() {
                let expected = if k == dim {
                    (i as i64 * block, (i as i64 + 1) * block, 1)
                } else {
                    (0, extent[k], 1)
                };
                if range != expected {
                    return None;
                }
            }
        }
        let unread = operands
            .iter()
            .zip(cuts)
            .filter(|(o, _)| self.uses[o] == 1 && self.free(**o))
            .map(|(o, (_, _, called))| (*o, called))
            .collect();
        Some(Found {
            all_to_all: a.id(),
            array,
            dim,
            pieces,
            concatenate: c,
            unread,
            concatenate_calls,
            copy: self.may_be_the_result(array),
        })
    }

    /// The dimensions `inst` concatenates its operands along, in their order, and the
    /// computations it calls: a `concatenate`, or a fusion of one `concatenate` of its
    /// parameters in their order.
    fn concatenation(&self, inst: &Instruction) -> Option<(Vec<i64>, Vec<i64>)> {
        let called = inst.called().ok()?;
        let joined = match inst.opcode().as_str() {
            "concatenate" if called.is_empty() => inst,
            "fusion" => {
                let &[fused] = &called[..] else {
                    return None;
                };
                let body = self.all.get(&fused)?;
                let root = body
                    .instructions
                    .iter()
                    .find(|i| i.id() == body.root_id())?;
                let number: HashMap<i64, i64> = body
                    .instructions
                    .iter()
                    .filter(|i| i.opcode() == "parameter")
                    .map(|p| (p.id(), p.0.int(instruction::PARAMETER_NUMBER)))
                    .collect();
                let order: Vec<i64> = root
                    .operands()
                    .ok()?
                    .iter()
                    .map(|o| number.get(o).copied())
                    .collect::<Option<_>>()?;
                let operands = inst.operands().ok()?.len();
                if root.opcode() != "concatenate"
                    || body.instructions.len() != operands + 1
                    || !order.iter().copied().eq(0..operands as i64)
                {
                    return None;
                }
                root
            }
            _ => return None,
        };
        Some((joined.0.ints(instruction::DIMENSIONS).ok()?, called))
    }

    /// Whether XLA may place the call's result in the memory of `array` itself, which MPI
    /// cannot send from and receive into at once. Copy insertion has run, on the slices:
    /// it kept apart what they read and what the concatenate wrote, not the array and the
    /// result. XLA puts both in one buffer where it must: a loop's state element read and
    /// given back (a loop body's parameter is its result), a branch's, or a donated
    /// argument of the entry given back as its result. The array is then read from a copy
    /// (one copy where the slices and the concatenate made two), as copy insertion would
    /// have made for the array all-to-all. Other values (computed here) have memory of
    /// their own: XLA gives a custom call's result its operand's memory only where told.
    fn may_be_the_result(&self, array: i64) -> bool {
        let mut at = array;
        loop {
            let Some(inst) = self.by_id.get(&at) else {
                return true;
            };
            match inst.opcode().as_str() {
                "parameter" => {
                    return self.computation.id() != self.entry.id || self.entry.donates;
                }
                "get-tuple-element" | "bitcast" | "tuple" | "copy" => {
                    let operands = inst.operands().unwrap_or_default();
                    let &[of] = &operands[..] else {
                        return true; // a tuple of several: where it comes from is unclear
                    };
                    at = of;
                }
                _ => return false,
            }
        }
    }

    /// What `inst` slices, how, and the computations it calls: a `slice`, or a fusion of
    /// one `slice` of its one parameter.
    fn slice_of(&self, inst: &Instruction) -> Option<(i64, Vec<Range>, Vec<i64>)> {
        let &[of] = &inst.operands().ok()?[..] else {
            return None;
        };
        let called = inst.called().ok()?;
        let cut = match inst.opcode().as_str() {
            "slice" if called.is_empty() => inst,
            "fusion" => {
                let &[fused] = &called[..] else {
                    return None;
                };
                let body = self.all.get(&fused)?;
                let [first, second] = &body.instructions[..] else {
                    return None;
                };
                let (parameter, root) = if first.id() == body.root_id() {
                    (second, first)
                } else {
                    (first, second)
                };
                if parameter.opcode() != "parameter"
                    || parameter.0.int(instruction::PARAMETER_NUMBER) != 0
                    || root.id() != body.root_id()
                    || root.opcode() != "slice"
                    || root.operands().ok()? != [parameter.id()]
                {
                    return None;
                }
                root
            }
            _ => return None,
        };
        let ranges = cut
            .0
            .messages(instruction::SLICE_DIMENSIONS)
            .ok()?
            .iter()
            .map(|d| {
                (
                    d.int(slice::START),
                    d.int(slice::LIMIT),
                    d.int(slice::STRIDE),
                )
            })
            .collect();
        Some((of, ranges, called))
    }
}

/// The computation with each found pattern replaced by its array all-to-all (after the
/// copy of its array it reads, if it needs one).
fn apply(computation: &mut Computation, founds: &[Found], names: &mut HashSet<String>) {
    let mut gone: HashSet<i64> = HashSet::new();
    let mut replacement: HashMap<i64, Vec<Instruction>> = HashMap::new();
    let high = computation
        .instructions
        .first()
        .map_or(0, |i| i.id() & !0xffff_ffff);
    let mut next_low = computation
        .instructions
        .iter()
        .map(|i| i.id() & 0xffff_ffff)
        .max()
        .unwrap_or(0)
        + 1;
    for f in founds {
        let Some(a) = computation
            .instructions
            .iter()
            .find(|i| i.id() == f.all_to_all)
        else {
            continue;
        };
        let Some(concatenate) = computation
            .instructions
            .iter()
            .find(|i| i.id() == f.concatenate)
        else {
            continue;
        };
        // Every field of the all-to-all (groups, channel, metadata, those no one here
        // names) but its operands, shape and id; split along `dim`.
        let mut placed = Vec::new();
        let mut operand = f.array;
        if f.copy {
            let Some(Ok(shape)) = computation
                .instructions
                .iter()
                .find(|i| i.id() == f.array)
                .map(Instruction::shape)
            else {
                continue;
            };
            let mut name = format!("{}.operand.jaxmpi", a.name());
            let mut n = 1;
            while names.contains(&name) {
                name = format!("{}.operand.jaxmpi{n}", a.name());
                n += 1;
            }
            names.insert(name.clone());
            operand = high | next_low;
            next_low += 1;
            placed.push(
                Instruction::new(operand, &name, "copy", &shape, &[f.array]).with_metadata_of(a),
            );
        }
        let mut merged = a.clone();
        merged.set_operands(&[operand]);
        if let Ok(shape) = concatenate.shape() {
            merged.set_shape(&shape);
        }
        merged.0.set_ints(instruction::DIMENSIONS, &[f.dim as i64]);
        merged.0.set_int(instruction::ID, f.concatenate);
        placed.push(merged);
        replacement.insert(f.all_to_all, placed);
        gone.extend(&f.pieces);
        gone.insert(f.concatenate);
        gone.extend(f.unread.iter().map(|(id, _)| *id));
    }
    let old = std::mem::take(&mut computation.instructions);
    computation.instructions = old
        .into_iter()
        .filter(|i| !gone.contains(&i.id()))
        .flat_map(|i| replacement.remove(&i.id()).unwrap_or_else(|| vec![i]))
        .collect();
}
