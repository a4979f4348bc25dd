//! Threads one token through every MPI call of a module, in the order `order.rs` finds:
//! each computation's instructions rebuilt with the token taken and given back by each
//! rewritten collective, waited for beside each jaxmpi op's own token, and carried through
//! the state of `while` loops and the operands and results of `conditional` branches.

use std::collections::{HashMap, HashSet};

use super::config::Config;
use super::order::{is_jaxmpi_op, Module};
use super::proto::{instruction, Instruction, Shape};
use super::rewrite::{encode_prologue, refusal, Among, Call, PROLOGUE};
use super::Refusal;

/// Where a computation's token comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// The entry: a fresh token.
    Fresh,
    /// A loop body, loop condition or branch: the last element of parameter 0.
    Parameter,
}

/// Threads the token through every MPI call, replacing each collective by its call;
/// `calling`: the computations that make MPI calls (`Module::calling_mpi_in_order`);
/// `groups`: the groups of devices they run among (`Module::groups_in_order`), whose
/// communicators a call before all the others, the program's prologue, makes.
pub fn thread(
    module: &mut Module,
    calls: &HashMap<(i64, i64), Call>,
    calling: &HashSet<i64>,
    groups: &[Among],
) -> Result<(), Refusal> {
    let entry = module.entry;
    let mut threader = Threader {
        module,
        calls,
        calling,
        groups,
        threaded: HashSet::new(),
    };
    threader.computation(entry, Start::Fresh)?;
    Ok(())
}

struct Threader<'a> {
    module: &'a mut Module,
    calls: &'a HashMap<(i64, i64), Call>,
    calling: &'a HashSet<i64>,
    groups: &'a [Among],
    /// Computations already threaded: one reached twice would get two tokens.
    threaded: HashSet<i64>,
}

/// Builds one computation's new instruction list.
struct Builder {
    out: Vec<Instruction>,
    shapes: HashMap<i64, Shape>,
    /// The id's high half (XLA's computation part) and the next free low half.
    high: i64,
    next_low: i64,
}

impl Builder {
    fn new(old: &[Instruction]) -> Result<Builder, Refusal> {
        let high = old.first().map_or(0, |i| i.id() & !0xffff_ffff);
        let next_low = old.iter().map(|i| i.id() & 0xffff_ffff).max().unwrap_or(0) + 1;
        let shapes = old
            .iter()
            .map(|i| Ok((i.id(), i.shape()?)))
            .collect::<Result<_, Refusal>>()?;
        Ok(Builder {
            out: Vec::with_capacity(old.len() + 8),
            shapes,
            high,
            next_low,
        })
    }

    fn fresh_id(&mut self) -> i64 {
        let id = self.high | self.next_low;
        self.next_low += 1;
        id
    }

    fn push(&mut self, inst: Instruction) -> Result<i64, Refusal> {
        let id = inst.id();
        self.shapes.insert(id, inst.shape()?);
        self.out.push(inst);
        Ok(id)
    }

    fn shape(&self, id: i64) -> Result<&Shape, Refusal> {
        self.shapes
            .get(&id)
            .ok_or_else(|| Refusal::module(format!("instruction {id} is used before it is made")))
    }
}

impl Threader<'_> {
    fn fresh_name(&mut self, base: &str) -> String {
        let mut name = format!("{base}.jaxmpi");
        let mut n = 1;
        while self.module.names.contains(&name) {
            name = format!("{base}.jaxmpi{n}");
            n += 1;
        }
        self.module.names.insert(name.clone());
        name
    }

    fn gte(&mut self, b: &mut Builder, of: i64, index: usize, base: &str) -> Result<i64, Refusal> {
        let shape = b
            .shape(of)?
            .elements()?
            .get(index)
            .cloned()
            .ok_or_else(|| {
                Refusal::module(format!(
                    "element {index} of instruction {of} does not exist"
                ))
            })?;
        let name = self.fresh_name(base);
        let gte = Instruction::get_tuple_element(b.fresh_id(), &name, &shape, of, index);
        b.push(gte)
    }

    /// A tuple of `value`'s elements and `token`: made from the operands where `value` is
    /// itself a tuple instruction, else from its elements.
    fn extended(
        &mut self,
        b: &mut Builder,
        value: &Instruction,
        token: i64,
    ) -> Result<i64, Refusal> {
        let shape = value.shape()?;
        if !shape.is_tuple() {
            return Err(refusal(
                value,
                "it carries MPI calls' order, which needs a tuple here, and is none",
            ));
        }
        let mut parts = if value.opcode() == "tuple" {
            value.operands()?
        } else {
            (0..shape.elements()?.len())
                .map(|i| self.gte(b, value.id(), i, &value.name()))
                .collect::<Result<_, _>>()?
        };
        parts.push(token);
        let extended = shape.appended(&Shape::token())?;
        let name = self.fresh_name(&value.name());
        let id = b.fresh_id();
        b.push(Instruction::new(id, &name, "tuple", &extended, &parts))
    }

    /// Threads the token through computation `cid`; returns the token its last MPI call
    /// gives (where it ends).
    fn computation(&mut self, cid: i64, start: Start) -> Result<i64, Refusal> {
        if !self.threaded.insert(cid) {
            return Err(Refusal::module(format!(
                "computation {} carries MPI calls' order and is called from several places",
                self.module.computation(cid).name()
            )));
        }
        let at = self.module.index[&cid];
        let mut old = std::mem::take(&mut self.module.computations[at].instructions);
        let mut b = Builder::new(&old)?;
        let mut chain;
        if start == Start::Fresh {
            let name = self.fresh_name("order");
            let id = b.fresh_id();
            chain = b.push(Instruction::new(
                id,
                &name,
                "after-all",
                &Shape::token(),
                &[],
            ))?;
            if !self.groups.is_empty() {
                chain = self.prologue(&mut b, chain)?;
            }
        } else {
            // Parameters take no operands: the first place is theirs without breaking the
            // dependency order.
            let p = old
                .iter()
                .position(|i| {
                    i.opcode() == "parameter" && i.0.int(instruction::PARAMETER_NUMBER) == 0
                })
                .ok_or_else(|| Refusal::module("a loop or branch computation has no parameter"))?;
            let mut parameter = old.remove(p);
            let shape = parameter.shape()?;
            if !shape.is_tuple() {
                return Err(refusal(
                    &parameter,
                    "a loop or branch whose state is no tuple",
                ));
            }
            // The parameter, now with the token, under a new id; its old id names the
            // tuple of its old elements, for the instructions that take it whole (an
            // inner conditional's operand, the root).
            let (kept, name) = (parameter.id(), parameter.name());
            let extended = shape.appended(&Shape::token())?;
            parameter.set_shape(&extended);
            parameter.0.set_int(instruction::ID, b.fresh_id());
            let pid = b.push(parameter)?;
            let n = shape.elements()?.len();
            let parts = (0..n)
                .map(|i| self.gte(&mut b, pid, i, &name))
                .collect::<Result<Vec<_>, _>>()?;
            let whole = self.fresh_name(&name);
            b.push(Instruction::new(kept, &whole, "tuple", &shape, &parts))?;
            chain = self.gte(&mut b, pid, n, "order")?;
            self.module.computations[at].set_program_shape(Some(&extended), None)?;
        }
        for inst in old {
            let key = (cid, inst.id());
            if let Some(call) = self.calls.get(&key) {
                chain = self.collective(&mut b, inst, call, chain)?;
            } else if is_jaxmpi_op(&inst) {
                chain = self.jaxmpi_op(&mut b, inst, chain)?;
            } else if inst.called()?.iter().any(|c| self.calling.contains(c)) {
                chain = match inst.opcode().as_str() {
                    "while" => self.while_loop(&mut b, inst, chain)?,
                    _ => self.conditional(&mut b, inst, chain)?,
                };
            } else {
                b.push(inst)?;
            }
        }
        self.module.computations[at].instructions = b.out;
        Ok(chain)
    }

    /// The program's prologue: a call that takes the token first and makes the
    /// communicators of `groups` (`jaxmpi_hlo_communicators`).
    fn prologue(&mut self, b: &mut Builder, chain: i64) -> Result<i64, Refusal> {
        let config = Config::default().ints("groups", &encode_prologue(self.groups));
        let name = self.fresh_name("communicators");
        let shape = Shape::tuple(&[Shape::token()]);
        let mut cc = Instruction::new(b.fresh_id(), &name, "custom-call", &shape, &[chain]);
        let m = &mut cc.0;
        m.set_string(instruction::CUSTOM_CALL_TARGET, PROLOGUE);
        m.set_string(instruction::BACKEND_CONFIG, &config.render());
        m.set_int(
            instruction::CUSTOM_CALL_API_VERSION,
            super::proto::API_VERSION_TYPED_FFI,
        );
        m.set_int(instruction::CUSTOM_CALL_HAS_SIDE_EFFECT, 1);
        let id = b.push(cc)?;
        self.gte(b, id, 0, &name)
    }

    /// The collective's call, taking and giving the token; the collective's id now names
    /// its result(s), so its users and the root need no change.
    fn collective(
        &mut self,
        b: &mut Builder,
        inst: Instruction,
        call: &Call,
        chain: i64,
    ) -> Result<i64, Refusal> {
        let shape = inst.shape()?;
        let results = if shape.is_tuple() {
            shape.elements()?
        } else {
            vec![shape.clone()]
        };
        let mut elements = results.clone();
        elements.push(Shape::token());
        let mut operands = inst.operands()?;
        operands.push(chain);
        let name = self.fresh_name(&inst.name());
        let mut cc = Instruction::new(
            b.fresh_id(),
            &name,
            "custom-call",
            &Shape::tuple(&elements),
            &operands,
        )
        .with_metadata_of(&inst);
        let m = &mut cc.0;
        m.set_string(instruction::CUSTOM_CALL_TARGET, call.target);
        m.set_string(instruction::BACKEND_CONFIG, &call.config.render());
        m.set_int(
            instruction::CUSTOM_CALL_API_VERSION,
            super::proto::API_VERSION_TYPED_FFI,
        );
        m.set_int(instruction::CUSTOM_CALL_HAS_SIDE_EFFECT, 1);
        for &(output, operand) in &call.aliases {
            let mut alias = super::wire::Message::default();
            alias.set_ints(super::proto::aliasing::OUTPUT_SHAPE_INDEX, &[output as i64]);
            alias.set_int(super::proto::aliasing::OPERAND_INDEX, operand as i64);
            m.push_message(instruction::OUTPUT_OPERAND_ALIASING, &alias);
        }
        let cid = b.push(cc)?;
        if shape.is_tuple() {
            let parts = (0..results.len())
                .map(|i| self.gte(b, cid, i, &inst.name()))
                .collect::<Result<Vec<_>, _>>()?;
            let tuple = Instruction::new(inst.id(), &inst.name(), "tuple", &shape, &parts)
                .with_metadata_of(&inst);
            b.push(tuple)?;
        } else {
            let value = Instruction::get_tuple_element(inst.id(), &inst.name(), &shape, cid, 0)
                .with_metadata_of(&inst);
            b.push(value)?;
        }
        self.gte(b, cid, results.len(), &inst.name())
    }

    /// jaxmpi's own op: it waits for the token beside its own, and gives its own on.
    fn jaxmpi_op(
        &mut self,
        b: &mut Builder,
        mut inst: Instruction,
        chain: i64,
    ) -> Result<i64, Refusal> {
        let mut operands = inst.operands()?;
        let Some(k) = operands
            .iter()
            .position(|&id| b.shapes.get(&id).is_some_and(Shape::is_token))
        else {
            return Err(refusal(&inst, "a jaxmpi op without its ordering token"));
        };
        let name = self.fresh_name(&inst.name());
        let joined = Instruction::new(
            b.fresh_id(),
            &name,
            "after-all",
            &Shape::token(),
            &[operands[k], chain],
        );
        operands[k] = b.push(joined)?;
        inst.set_operands(&operands);
        let shape = inst.shape()?;
        let id = b.push(inst.clone())?;
        if shape.is_token() {
            return Ok(id);
        }
        let elements = shape.elements()?;
        match elements.last() {
            Some(last) if last.is_token() => self.gte(b, id, elements.len() - 1, &inst.name()),
            _ => Err(refusal(&inst, "a jaxmpi op that gives no ordering token")),
        }
    }

    /// The root of computation `cid` with `token` appended.
    fn extend_root(&mut self, cid: i64, token: i64) -> Result<(), Refusal> {
        let at = self.module.index[&cid];
        let old = std::mem::take(&mut self.module.computations[at].instructions);
        let root_id = self.module.computations[at].root_id();
        let mut b = Builder::new(&old)?;
        let root = old
            .iter()
            .find(|i| i.id() == root_id)
            .cloned()
            .ok_or_else(|| Refusal::module("a loop or branch computation has no root"))?;
        for inst in old {
            b.push(inst)?;
        }
        let new_root = self.extended(&mut b, &root, token)?;
        let shape = b.shape(new_root)?.clone();
        let computation = &mut self.module.computations[at];
        computation.instructions = b.out;
        computation.set_root_id(new_root);
        computation.set_program_shape(None, Some(&shape))?;
        Ok(())
    }

    fn while_loop(
        &mut self,
        b: &mut Builder,
        mut inst: Instruction,
        chain: i64,
    ) -> Result<i64, Refusal> {
        let [init] = inst.operands()?[..] else {
            return Err(refusal(&inst, "a loop with other than one state"));
        };
        let init_inst = self.find(b, init)?;
        let state = self.extended(b, &init_inst, chain)?;
        // XLA lists a loop's body first, then its condition.
        let [body, condition] = inst.called()?[..] else {
            return Err(refusal(&inst, "a loop without one body and one condition"));
        };
        let end = self.computation(body, Start::Parameter)?;
        self.extend_root(body, end)?;
        self.computation(condition, Start::Parameter)?;
        inst.set_operands(&[state]);
        self.with_token(b, inst)
    }

    /// Pushes a loop or conditional whose result now ends with the token, under a new id;
    /// its old id names the tuple of its old elements, so that every instruction that
    /// read it (whole, as an inner conditional's operand or the root, or an element)
    /// reads the same as before. Returns the token it gives on.
    fn with_token(&mut self, b: &mut Builder, mut inst: Instruction) -> Result<i64, Refusal> {
        let (kept, name, shape) = (inst.id(), inst.name(), inst.shape()?);
        if !shape.is_tuple() {
            return Err(refusal(
                &inst,
                "a loop or conditional whose result is no tuple",
            ));
        }
        inst.set_shape(&shape.appended(&Shape::token())?);
        inst.0.set_int(instruction::ID, b.fresh_id());
        let id = b.push(inst)?;
        let n = shape.elements()?.len();
        let parts = (0..n)
            .map(|i| self.gte(b, id, i, &name))
            .collect::<Result<Vec<_>, _>>()?;
        let whole = self.fresh_name(&name);
        b.push(Instruction::new(kept, &whole, "tuple", &shape, &parts))?;
        self.gte(b, id, n, &name)
    }

    fn conditional(
        &mut self,
        b: &mut Builder,
        mut inst: Instruction,
        chain: i64,
    ) -> Result<i64, Refusal> {
        let mut operands = inst.operands()?;
        let branches = inst.called()?;
        if operands.len() != branches.len() + 1 {
            return Err(refusal(
                &inst,
                "a conditional whose branches and operands differ in number",
            ));
        }
        let mut extended: HashMap<i64, i64> = HashMap::new();
        for (k, &branch) in branches.iter().enumerate() {
            let operand = operands[k + 1];
            let state = match extended.get(&operand) {
                Some(&s) => s,
                None => {
                    let operand_inst = self.find(b, operand)?;
                    let s = self.extended(b, &operand_inst, chain)?;
                    extended.insert(operand, s);
                    s
                }
            };
            operands[k + 1] = state;
            let end = self.computation(branch, Start::Parameter)?;
            self.extend_root(branch, end)?;
        }
        inst.set_operands(&operands);
        self.with_token(b, inst)
    }

    /// An instruction already placed in the computation being built.
    fn find(&self, b: &Builder, id: i64) -> Result<Instruction, Refusal> {
        b.out
            .iter()
            .find(|i| i.id() == id)
            .cloned()
            .ok_or_else(|| Refusal::module(format!("instruction {id} is used before it is made")))
    }
}
