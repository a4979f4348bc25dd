//! An op's attributes: the kinds of attribute a lowering may pass, how each is encoded on
//! the wire (every attribute is an int64 scalar or an int64 array) and decoded into the
//! typed value an op body reads. Which attributes each op has is declared once, in the
//! handlers' table (`xla/handlers/mod.rs`); Python reads the kinds through `_native`.

use super::handles::{resolve, Table};
use super::Call;
use crate::xla::mesh::{is_mesh_comm, ON_DEVICES};
use crate::{Comm, Peer, ReduceOp, Result};

/// Portable encodings shared with the Python lowerings, which import them from `_native`:
/// MPI's own values differ between libraries, these never do.
pub const PEER_ANY: i32 = -1;
pub const PEER_NULL: i32 = -2;
pub const TAG_ANY: i32 = -1;
/// The `op` code of a user-defined reduction; its handle travels in `USER_OP`.
pub const OP_USER: i64 = -1;
/// The attribute that follows every [`Kind::ReduceOp`] one: the user op's handle.
pub const USER_OP: &str = "user_op";

/// The kind of an attribute: its Python encoding and its Rust type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A communicator handle ([`Comm`]).
    Comm,
    /// A raw address or handle, passed as its 64-bit two's-complement pattern.
    Address,
    /// A reduction: an index into `ReduceOp::PREDEFINED`, or `OP_USER` with the user op's
    /// handle in the `USER_OP` attribute, which every op with a reduction has.
    ReduceOp,
    /// A rank, `PEER_ANY` or `PEER_NULL` ([`Peer`]).
    Peer,
    /// A C int (a root, a tag that cannot be "any").
    Int,
    /// A tag or `TAG_ANY` (`None`).
    AnyTag,
    /// Per-rank counts of rows (entries of the leading axis), blocks back to back in rank
    /// order; the handler turns them into element counts and displacements.
    Counts,
    /// Devices by global id: in groups (each group's size, then its devices), or in
    /// (source, target) pairs ([`Devices`]).
    Devices,
    /// Non-negative sizes, one per operand ([`Sizes`]).
    Sizes,
    /// Words for people ([`Shown`]).
    Text,
    /// The layout of the pytree a call belongs to ([`Tree`]).
    Tree,
}

impl Kind {
    /// The name Python sees (`_native.signatures()`).
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Comm => "comm",
            Kind::Address => "address",
            Kind::ReduceOp => "reduce_op",
            Kind::Peer => "peer",
            Kind::Int => "int",
            Kind::AnyTag => "any_tag",
            Kind::Counts => "counts",
            Kind::Devices => "devices",
            Kind::Sizes => "sizes",
            Kind::Text => "text",
            Kind::Tree => "tree",
        }
    }
}

/// A handle or address that is not a communicator (an mpi4py Status's MPI_Status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Address(pub usize);

/// Per-rank row counts (see [`Kind::Counts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts(pub Vec<usize>);

impl Counts {
    /// Element counts and displacements for rows of `row` elements each.
    pub fn elements(&self, row: usize) -> (Vec<usize>, Vec<usize>) {
        let counts: Vec<usize> = self.0.iter().map(|rows| rows * row).collect();
        let displs = counts
            .iter()
            .scan(0, |next, &count| {
                let at = *next;
                *next += count;
                Some(at)
            })
            .collect();
        (counts, displs)
    }
}

/// The devices of an XLA collective (`handlers/hlo.rs`), by global id, as the HLO pass wrote them
/// (`xla/mesh/place.rs` reads them): a view of the call's attribute, which XLA keeps for as
/// long as the program, so a call finds its group without copying them.
#[derive(Clone, Copy, Debug)]
pub struct Devices {
    at: *const i64,
    len: usize,
}

impl Devices {
    /// The devices, for the call they came with.
    pub fn of<'c>(&self, _call: &Call<'c>) -> &'c [i64] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: read from the call's attributes (`decode`), which live at least as long
        // as the call the result is tied to.
        unsafe { std::slice::from_raw_parts(self.at, self.len) }
    }

    /// Where the view points (with `of`, what a cache of groups is keyed by).
    pub fn key(&self) -> (usize, usize) {
        (self.at as usize, self.len)
    }
}

/// A size per operand (how many slices lie outside a collective's dimension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sizes(pub Vec<usize>);

/// Words for people (the JAX operation an XLA collective came from): read only where a
/// call is shown (`handlers/services/call_info.rs`, which does without it), so decoding
/// reads nothing: a call does not pay for words it does not show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shown;

/// The pytree a call moves part of: a fingerprint of its leaves' paths, dtypes and shapes
/// (the same on every rank that passes the same structure), or 0 for a single array. A
/// pytree travels as one call per group of leaves (`python/jaxmpi/_trees.py`), each
/// carrying the whole tree's fingerprint: checked mode compares it, which the packed
/// buffers alone could not show (two trees may pack to the same dtype and size). Only
/// checked mode reads it (`Tree::of`), so decoding reads nothing: no cost per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tree(pub &'static str);

impl Tree {
    /// The fingerprint the call carries (0 where it carries none).
    pub fn of(&self, call: &Call) -> u64 {
        call.optional_i64(self.0).unwrap_or(0) as u64
    }
}

/// A Rust type an attribute decodes into; its kind is what Python is told.
pub trait Attr: Sized {
    const KIND: Kind;
    fn decode(call: &Call, name: &'static str) -> Result<Self>;
    /// The communicator this attribute names, if it names one.
    fn as_comm(&self) -> Option<Comm> {
        None
    }
    /// The mpi4py Status this attribute names, if it names one.
    fn as_status(&self) -> Option<Address> {
        None
    }
}

/// An op's attributes as one typed value, decoded before its body runs.
pub trait Attrs: Sized {
    fn decode(call: &Call) -> Result<Self>;
    /// The communicator the op runs on, where the program names one; XLA's collectives
    /// (`handlers/hlo.rs`) find theirs from their devices when they run.
    fn comm(&self) -> Option<Comm>;
    /// The mpi4py Status a receive fills, where the op has one.
    fn status(&self) -> Option<Address>;
}

fn int(call: &Call, name: &'static str) -> Result<i32> {
    let value = call.scalar_i64(name)?;
    i32::try_from(value)
        .map_err(|_| call.bad_attr(name, format_args!("= {value} does not fit a C int")))
}

/// The raw value behind the id `id` a handle attribute carries (`handles.rs`).
fn handle(call: &Call, (name, id): (&'static str, i64), which: Table) -> Result<usize> {
    resolve(which, id).ok_or_else(|| {
        call.bad_attr(
            name,
            format_args!(
                "= {id} names no handle this process has lowered a program with (a program \
                 compiled in another process or run?)"
            ),
        )
    })
}

fn address(call: &Call, name: &'static str) -> Result<usize> {
    handle(call, (name, call.scalar_i64(name)?), Table::Address)
}

impl Attr for Comm {
    const KIND: Kind = Kind::Comm;
    fn decode(call: &Call, name: &'static str) -> Result<Self> {
        let id = call.scalar_i64(name)?;
        if is_mesh_comm(id) {
            return Ok(ON_DEVICES);
        }
        Ok(Comm(handle(call, (name, id), Table::Comm)?))
    }
    /// None on a MeshComm: no MPI handle, and its communicators among
    /// processes return errors from the start.
    fn as_comm(&self) -> Option<Comm> {
        (*self != ON_DEVICES).then_some(*self)
    }
}

impl Attr for Address {
    const KIND: Kind = Kind::Address;
    fn decode(call: &Call, name: &'static str) -> Result<Self> {
        Ok(Address(address(call, name)?))
    }
    fn as_status(&self) -> Option<Address> {
        Some(*self)
    }
}

impl Attr for ReduceOp {
    const KIND: Kind = Kind::ReduceOp;
    fn decode(call: &Call, name: &'static str) -> Result<Self> {
        let code = call.scalar_i64(name)?;
        if code == OP_USER {
            return Ok(ReduceOp::User(address(call, USER_OP)?));
        }
        usize::try_from(code)
            .ok()
            .and_then(|i| ReduceOp::PREDEFINED.get(i).copied())
            .ok_or_else(|| call.bad_attr(name, format_args!("= {code} is no op code")))
    }
}

impl Attr for Peer {
    const KIND: Kind = Kind::Peer;
    fn decode(call: &Call, name: &'static str) -> Result<Self> {
        let value = call.per_rank_i64(name)?;
        let peer = i32::try_from(value)
            .map_err(|_| call.bad_attr(name, format_args!("= {value} does not fit a C int")))?;
        Ok(match peer {
            PEER_ANY => Peer::Any,
            PEER_NULL => Peer::Null,
            rank if rank >= 0 => Peer::Rank(rank),
            other => return Err(call.bad_attr(name, format_args!("= {other} is not a rank"))),
        })
    }
}

impl Attr for i32 {
    const KIND: Kind = Kind::Int;
    fn decode(call: &Call, name: &'static str) -> Result<Self> {
        int(call, name)
    }
}

impl Attr for Option<i32> {
    const KIND: Kind = Kind::AnyTag;
    fn decode(call: &Call, name: &'static str) -> Result<Self> {
        Ok(match int(call, name)? {
            TAG_ANY => None,
            tag => Some(tag),
        })
    }
}

impl Attr for Counts {
    const KIND: Kind = Kind::Counts;
    fn decode(call: &Call, name: &'static str) -> Result<Self> {
        let values = call.array_i64(name)?;
        let counts = values.iter().map(|&v| {
            usize::try_from(v)
                .map_err(|_| call.bad_attr(name, format_args!("has the negative count {v}")))
        });
        Ok(Counts(counts.collect::<Result<_>>()?))
    }
}

fn sizes(call: &Call, name: &'static str) -> Result<Vec<usize>> {
    call.array_i64(name)?
        .iter()
        .map(|&v| {
            usize::try_from(v).map_err(|_| call.bad_attr(name, format_args!("holds {v} < 0")))
        })
        .collect()
}

impl Attr for Devices {
    const KIND: Kind = Kind::Devices;
    fn decode(call: &Call, name: &'static str) -> Result<Self> {
        let devices = call.array_i64(name)?;
        Ok(Devices {
            at: devices.as_ptr(),
            len: devices.len(),
        })
    }
}

impl Attr for Sizes {
    const KIND: Kind = Kind::Sizes;
    fn decode(call: &Call, name: &'static str) -> Result<Self> {
        Ok(Sizes(sizes(call, name)?))
    }
}

impl Attr for Tree {
    const KIND: Kind = Kind::Tree;
    fn decode(_: &Call, name: &'static str) -> Result<Self> {
        Ok(Tree(name))
    }
}

impl Attr for Shown {
    const KIND: Kind = Kind::Text;
    fn decode(_: &Call, _: &'static str) -> Result<Self> {
        Ok(Shown)
    }
}
