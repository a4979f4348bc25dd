//! The HLO pass that hands XLA's collectives to jaxmpi: JAX registers it (jax >= 0.10.2,
//! `jax.extend.xla.register_hlo_module_transformation`) and calls it with every CPU module
//! after SPMD partitioning; it replaces every all-reduce, all-gather, reduce-scatter,
//! all-to-all, collective-permute and ragged-all-to-all by a call to a `jaxmpi_hlo_*`
//! handler (`handlers/hlo.rs`), and threads one token through those calls and jaxmpi's own
//! ops so that every rank makes its MPI calls in one order.
//!
//! All or none: a module it cannot take whole is refused with the instruction and the
//! reason (a collective left to XLA would be unordered against the rewritten ones).
//!
//! `wire.rs` reads and writes the protobuf bytes keeping every field it does not name,
//! `proto.rs` names the fields it does, `groups.rs` turns XLA's replica groups into global
//! device ids, `tiled.rs` puts back the array all-to-alls XLA took apart into slices, a
//! tuple all-to-all and a concatenate, `rewrite.rs` replaces each collective, `order.rs`
//! finds the calls to order and refuses what cannot be ordered, `threader.rs` threads the
//! token, and `pass.rs` runs them on a whole module.

mod config;
mod groups;
mod in_place;
mod order;
mod pass;
mod proto;
mod rewrite;
#[cfg(test)]
mod tests;
mod threader;
#[cfg(test)]
mod threader_tests;
mod tiled;
#[cfg(test)]
mod tiled_tests;
mod wire;

use std::fmt;

pub use pass::{rewrite_module, Rewritten};

/// The pass's revision: raise it whenever the pass writes another program for the same
/// module (the tiled all-to-all taken whole was 2, the prologue making the communicators 3,
/// a permute's groups marked in the prologue 4). JAX's persistent compilation cache is
/// salted with it, so that ranks running different revisions never share a program whose
/// MPI calls differ.
pub const REVISION: u32 = 4;
pub use rewrite::{PROLOGUE, TARGETS};

/// Why a module cannot run over jaxmpi: compiling it fails with this, before anything runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The instruction (its HLO name and the JAX operation it came from), if one is to blame.
    pub instruction: Option<(String, String)>,
    pub reason: String,
}

impl Refusal {
    pub fn module(reason: impl Into<String>) -> Refusal {
        Refusal {
            instruction: None,
            reason: reason.into(),
        }
    }

    pub fn at(name: String, jax_op: String, reason: impl Into<String>) -> Refusal {
        Refusal {
            instruction: Some((name, jax_op)),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("jaxmpi cannot run this program's collectives over MPI: ")?;
        match &self.instruction {
            Some((name, jax_op)) if !jax_op.is_empty() => {
                write!(f, "{name} (from {jax_op}): ")?;
            }
            Some((name, _)) => write!(f, "{name}: ")?,
            None => {}
        }
        write!(
            f,
            "{}. Rewrite that part of the program, or run JAX's collectives over gloo \
             (jaxmpi.distributed.initialize(collectives=\"gloo\"))",
            self.reason
        )
    }
}

impl From<wire::WireError> for Refusal {
    fn from(err: wire::WireError) -> Refusal {
        Refusal::module(format!(
            "the HLO module XLA handed over is malformed ({err})"
        ))
    }
}
