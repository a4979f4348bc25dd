//! One order for every MPI call of a module. XLA:CPU orders its own collectives among
//! themselves, but a custom call only by its operands: independent calls may run in any
//! order, or at once, differently on each rank (a deadlock). So one token goes through
//! every MPI call of the module in its instruction order (a dependency order, the same on
//! every rank for the same program): each rewritten collective takes it and gives it back,
//! each jaxmpi op waits for it beside its own token (`after-all`), and it travels through
//! the state of `while` loops and the operands and results of `conditional` branches, so
//! the calls inside a loop or a branch keep their place too.

use std::collections::{HashMap, HashSet};

use super::proto::{instruction, Computation, Instruction, Shape};
use super::rewrite::{self, refusal, Call, Kind};
use super::Refusal;

/// Where a computation's token comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// The entry: a fresh token.
    Fresh,
    /// A loop body, loop condition or branch: the last element of parameter 0.
    Parameter,
}

pub struct Module {
    computations: Vec<Computation>,
    index: HashMap<i64, usize>,
    entry: i64,
    names: HashSet<String>,
}

/// The public op a `jaxmpi_ragged_alltoallv` call serves (its `origin` attribute).
fn ragged_origin(inst: &Instruction) -> Option<&'static str> {
    let config = inst.0.string(instruction::BACKEND_CONFIG);
    let value = config.split("origin = ").nth(1)?.split(' ').next()?;
    let index: usize = value.trim_end_matches([',', '}']).parse().ok()?;
    crate::xla::handlers::ragged::ORIGINS.get(index).copied()
}

fn is_jaxmpi_op(inst: &Instruction) -> bool {
    inst.opcode() == "custom-call" && inst.target().starts_with("jaxmpi_")
}

impl Module {
    pub fn new(computations: Vec<Computation>, entry: i64) -> Result<Module, Refusal> {
        let index = computations
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id(), i))
            .collect::<HashMap<_, _>>();
        if !index.contains_key(&entry) {
            return Err(Refusal::module("its entry computation is missing"));
        }
        let names = computations
            .iter()
            .flat_map(|c| c.instructions.iter().map(Instruction::name))
            .collect();
        Ok(Module {
            computations,
            index,
            entry,
            names,
        })
    }

    pub fn into_computations(self) -> Vec<Computation> {
        self.computations
    }

    fn computation(&self, id: i64) -> &Computation {
        &self.computations[self.index[&id]]
    }

    /// What every collective becomes, keyed by (computation id, instruction id); refuses
    /// the module if one cannot be taken.
    pub fn translate(
        &self,
        mut translate: impl FnMut(
            &Instruction,
            &Computation,
            &HashMap<i64, &Computation>,
            bool,
        ) -> Result<Call, Refusal>,
    ) -> Result<HashMap<(i64, i64), Call>, Refusal> {
        let all: HashMap<i64, &Computation> =
            self.computations.iter().map(|c| (c.id(), c)).collect();
        // Loop bodies (a while lists its body first): their state is the loop's own.
        let mut bodies = HashSet::new();
        for computation in &self.computations {
            for inst in computation
                .instructions
                .iter()
                .filter(|i| i.opcode() == "while")
            {
                bodies.extend(inst.called()?.first().copied());
            }
        }
        let mut calls = HashMap::new();
        for computation in &self.computations {
            for inst in &computation.instructions {
                match rewrite::kind(inst) {
                    Kind::Collective => {
                        let body = bodies.contains(&computation.id());
                        let call = translate(inst, computation, &all, body)?;
                        calls.insert((computation.id(), inst.id()), call);
                    }
                    Kind::Refused => {
                        return Err(refusal(
                            inst,
                            format!(
                                "jaxmpi does not take XLA's {} (only synchronous all-reduce, \
                                 all-gather, reduce-scatter, all-to-all, collective-permute \
                                 and ragged-all-to-all)",
                                inst.opcode()
                            ),
                        ))
                    }
                    Kind::Other => {}
                }
            }
        }
        Ok(calls)
    }

    /// The computations that make MPI calls, directly or through the loops and branches
    /// they hold; refuses one reached any other way (a `call`, a fusion), which the token
    /// could not follow.
    fn calling_mpi(&self, calls: &HashMap<(i64, i64), Call>) -> Result<HashSet<i64>, Refusal> {
        let mut found: HashSet<i64> = HashSet::new();
        // Until nothing changes: a computation makes MPI calls if it holds one, or holds a
        // loop or branch whose computation does.
        loop {
            let before = found.len();
            for computation in &self.computations {
                let cid = computation.id();
                if found.contains(&cid) {
                    continue;
                }
                for inst in &computation.instructions {
                    let direct = calls.contains_key(&(cid, inst.id())) || is_jaxmpi_op(inst);
                    let through = inst.called()?.iter().any(|c| found.contains(c));
                    if direct || through {
                        found.insert(cid);
                        break;
                    }
                }
            }
            if found.len() == before {
                break;
            }
        }
        for computation in &self.computations {
            for inst in &computation.instructions {
                let opcode = inst.opcode();
                if opcode == "while" || opcode == "conditional" {
                    continue;
                }
                if inst.called()?.iter().any(|c| found.contains(c)) {
                    return Err(refusal(
                        inst,
                        format!(
                            "it calls MPI from inside a {opcode}, through which jaxmpi cannot \
                             keep the calls in order"
                        ),
                    ));
                }
            }
        }
        Ok(found)
    }

    /// The token follows the module's instruction order, which XLA derives from the
    /// program's graph: the same on every rank for the same program. Inside shard_map
    /// jaxmpi's rooted ops bind the root's result on every rank (`_comm.at_root`), so they
    /// keep the program the same; gatherv and scatterv (whose shapes, or counts, follow the
    /// rank, in both their forms) still make the ranks' programs differ, and with them the
    /// order of the calls around them: a deadlock with a collective beside them. Such a
    /// program is refused.
    fn refuse_programs_that_differ_by_rank(
        &self,
        calls: &HashMap<(i64, i64), Call>,
    ) -> Result<(), Refusal> {
        const BY_RANK: [&str; 2] = ["gatherv", "scatterv"];
        let Some(&(cid, id)) = calls.keys().next() else {
            return Ok(());
        };
        let collective = self
            .computation(cid)
            .instructions
            .iter()
            .find(|i| i.id() == id);
        for inst in self.computations.iter().flat_map(|c| &c.instructions) {
            let target = inst.target();
            let op = target.strip_prefix("jaxmpi_").unwrap_or_default();
            let ragged_from = (op == "ragged_alltoallv")
                .then(|| ragged_origin(inst))
                .flatten();
            let by_rank = BY_RANK.contains(&ragged_from.unwrap_or(op));
            if inst.opcode() == "custom-call" && by_rank {
                let name = ragged_from.unwrap_or(op);
                let beside = collective.map(Instruction::op_name).unwrap_or_default();
                return Err(refusal(
                    inst,
                    format!(
                        "jaxmpi.{name} gives each rank another program (its shapes follow \
                         the rank), so the MPI calls of JAX's collectives beside it \
                         ({beside}) cannot be put in one order on every rank. Call \
                         jaxmpi.{name} in a jitted function of its own (calls of separate \
                         programs keep their order)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Threads the token through every MPI call, replacing each collective by its call.
    pub fn thread(&mut self, calls: &HashMap<(i64, i64), Call>) -> Result<(), Refusal> {
        self.refuse_programs_that_differ_by_rank(calls)?;
        let calling = self.calling_mpi(calls)?;
        let mut callers: HashMap<i64, usize> = HashMap::new();
        for computation in &self.computations {
            for inst in &computation.instructions {
                for c in inst.called()? {
                    *callers.entry(c).or_default() += 1;
                }
            }
        }
        if let Some(shared) = calling
            .iter()
            .find(|&&c| c != self.entry && callers.get(&c).copied().unwrap_or(0) != 1)
        {
            return Err(Refusal::module(format!(
                "computation {} makes MPI calls and is called from several places",
                self.computation(*shared).name()
            )));
        }
        let mut threader = Threader {
            module: self,
            calls,
            calling: &calling,
            threaded: HashSet::new(),
        };
        threader.computation(threader.module.entry, Start::Fresh)?;
        Ok(())
    }
}

struct Threader<'a> {
    module: &'a mut Module,
    calls: &'a HashMap<(i64, i64), Call>,
    calling: &'a HashSet<i64>,
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
            let extended = shape.appended(&Shape::token())?;
            parameter.set_shape(&extended);
            let pid = b.push(parameter)?;
            let n = shape.elements()?.len();
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
        let shape = inst.shape()?.appended(&Shape::token())?;
        inst.set_shape(&shape);
        inst.set_operands(&[state]);
        let name = inst.name();
        let id = b.push(inst)?;
        let n = shape.elements()?.len() - 1;
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
        let shape = inst.shape()?;
        if !shape.is_tuple() {
            return Err(refusal(&inst, "a conditional whose result is no tuple"));
        }
        let shape = shape.appended(&Shape::token())?;
        inst.set_shape(&shape);
        inst.set_operands(&operands);
        let name = inst.name();
        let id = b.push(inst)?;
        let n = shape.elements()?.len() - 1;
        self.gte(b, id, n, &name)
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
