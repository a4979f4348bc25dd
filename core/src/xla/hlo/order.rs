//! One order for every MPI call of a module. XLA:CPU orders its own collectives among
//! themselves, but a custom call only by its operands: independent calls may run in any
//! order, or at once, differently on each rank (a deadlock). So one token goes through
//! every MPI call of the module in its instruction order (a dependency order, the same on
//! every rank for the same program): each rewritten collective takes it and gives it back,
//! each jaxmpi op waits for it beside its own token (`after-all`), and it travels through
//! the state of `while` loops and the operands and results of `conditional` branches, so
//! the calls inside a loop or a branch keep their place too.
//!
//! This file finds the calls and what refuses a module; `threader.rs` threads the token.

use std::collections::{HashMap, HashSet};

use super::proto::{instruction, Computation, Instruction};
use super::rewrite::{self, refusal, target_of, Among, Call, Kind};
use super::Refusal;

pub struct Module {
    pub(super) computations: Vec<Computation>,
    pub(super) index: HashMap<i64, usize>,
    pub(super) entry: i64,
    /// Every instruction's name: new ones must differ from them all.
    pub(super) names: HashSet<String>,
}

/// The public op a `jaxmpi_ragged_alltoallv` call serves (its `origin` attribute).
fn ragged_origin(inst: &Instruction) -> Option<&'static str> {
    let config = inst.0.string(instruction::BACKEND_CONFIG);
    let value = config.split("origin = ").nth(1)?.split(' ').next()?;
    let index: usize = value.trim_end_matches([',', '}']).parse().ok()?;
    crate::xla::handlers::ragged::ORIGINS.get(index).copied()
}

pub(super) fn is_jaxmpi_op(inst: &Instruction) -> bool {
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

    pub(super) fn computation(&self, id: i64) -> &Computation {
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

    /// Every group of devices the calls run among (of two or more devices), once each, in
    /// the module's order: the same on every rank for the same program, the order its
    /// prologue makes their communicators in (`mesh/communicators.rs`).
    pub fn groups_in_order(&self, calls: &HashMap<(i64, i64), Call>) -> Vec<Among> {
        let permute = target_of("collective-permute");
        let mut seen = HashSet::new();
        let mut groups = Vec::new();
        for computation in &self.computations {
            for inst in &computation.instructions {
                let Some(call) = calls.get(&(computation.id(), inst.id())) else {
                    continue;
                };
                for group in &call.groups {
                    let among = Among {
                        devices: group.clone(),
                        permute: Some(call.target) == permute,
                    };
                    if group.len() > 1 && seen.insert(among.clone()) {
                        groups.push(among);
                    }
                }
            }
        }
        groups
    }

    /// The computations that make MPI calls, refusing a module whose calls cannot be put
    /// in one order: programs that differ by rank, or a computation making MPI calls that
    /// is called from several places (it would need a token from each).
    pub fn calling_mpi_in_order(
        &self,
        calls: &HashMap<(i64, i64), Call>,
    ) -> Result<HashSet<i64>, Refusal> {
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
        Ok(calling)
    }
}
