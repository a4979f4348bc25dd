//! XLA's collectives, as the HLO pass (`xla/hlo`) hands them over: an adapter per HLO
//! opcode, run on every device of the program, from the call frame to the device-rank
//! layer (`xla/mesh`), which runs every collective among devices. In checked mode the
//! group's devices first compare their calls, as the ranks of a communicator do.

use super::attrs;
use super::services::checked;
use crate::xla::frame::{Call, Devices, Operand};
use crate::xla::mesh::ON_DEVICES;
use crate::xla::mesh::{
    self, collectives, reductions, AllToAll, CallKey, Naming, OnDevices, Place, Seat, Span, Spans,
};
use crate::{Backend, Error, Library, Result};

fn span(operand: &Operand) -> Result<Span> {
    Ok(Span {
        ptr: operand.data() as usize,
        count: operand.count(),
        dtype: operand.dtype()?,
    })
}

fn seat_of(call: &Call, key: CallKey) -> Result<Seat> {
    Ok(Seat::of_buffers(
        key,
        spans(call.args_len(), |i| span(&call.arg(i)?))?,
        spans(call.rets_len(), |i| span(&call.ret(i)?))?,
    ))
}

/// The `n` spans `nth` gives: one in place, with no allocation (nearly every call), more
/// in a Vec. (Collecting into `Spans` through `FromIterator` costs a 1-element psum about
/// 140 instructions more: the shunt that stops at the first error.)
fn spans(n: usize, nth: impl Fn(usize) -> Result<Span>) -> Result<Spans> {
    if n == 1 {
        return Ok(Spans::One(nth(0)?));
    }
    (0..n).map(nth).collect::<Result<Vec<_>>>().map(Spans::Many)
}

/// Runs `run` on the seats of this process's devices of the call's group, once they all
/// arrived (at once where the device is the only one); `key` is what the call is, past
/// its buffers (`CallKey`; a permute's pairs are added). None: a pair names no such device.
fn on_group(
    call: &Call,
    library: &dyn Library,
    naming: Naming,
    key: CallKey,
    run: impl FnOnce(&Place, &[Seat]) -> Result<()>,
) -> Result<Option<()>> {
    let Some(place) = mesh::placed(library, naming, call.device()?)? else {
        return Ok(None);
    };
    let group = &place.group;
    if checked::enabled() {
        let ranks = OnDevices::in_group(crate::library()?, group.clone(), place.position);
        checked::collective(call, &ranks, ON_DEVICES)?;
    }
    let key = key.and(place.detail);
    group
        .meet(place.position, seat_of(call, key)?, |seats| {
            run(&place, seats)
        })
        .map(Some)
}

/// The key of a call that works along a dimension with `outer` slices outside it.
fn along(call: &Call, outer: &[usize]) -> CallKey {
    let slices = outer
        .iter()
        .fold(outer.len() as u64, |h, &o| h.rotate_left(17) ^ o as u64);
    CallKey::new(call.name(), slices)
}

/// The call's groups, as its attribute lists them.
fn groups<'c>(call: &Call<'c>, groups: &Devices) -> Naming<'c> {
    Naming::Groups {
        at: groups.key(),
        flat: groups.of(call),
    }
}

pub fn hlo_all_reduce(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloAllReduce,
) -> Result<()> {
    let key = CallKey::reducing(call.name(), a.op, 0);
    on_group(
        call,
        library,
        groups(call, &a.groups),
        key,
        |place, seats| reductions::all_reduce(&place.group, library, backend, seats, a.op),
    )
    .map(|_| ())
}

pub fn hlo_all_gather(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloAllGather,
) -> Result<()> {
    let key = along(call, &a.outer.0);
    on_group(
        call,
        library,
        groups(call, &a.groups),
        key,
        |place, seats| collectives::all_gather(&place.group, library, backend, seats, &a.outer.0),
    )
    .map(|_| ())
}

pub fn hlo_reduce_scatter(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloReduceScatter,
) -> Result<()> {
    let key = CallKey::reducing(call.name(), a.op, along(call, &a.outer.0).detail);
    on_group(
        call,
        library,
        groups(call, &a.groups),
        key,
        |place, seats| {
            reductions::reduce_scatter(&place.group, library, backend, seats, &a.outer.0, a.op)
        },
    )
    .map(|_| ())
}

pub fn hlo_all_to_all(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloAllToAll,
) -> Result<()> {
    let form = match a.outer.0[..] {
        [] => AllToAll::Arrays,
        [outer] => AllToAll::Array { outer },
        _ => {
            return Err(Error::invalid_argument(
                call.name(),
                "outer: one size at most",
            ))
        }
    };
    let key = along(call, &a.outer.0);
    on_group(
        call,
        library,
        groups(call, &a.groups),
        key,
        |place, seats| collectives::all_to_all(&place.group, library, backend, seats, form),
    )
    .map(|_| ())
}

pub fn hlo_collective_permute(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloCollectivePermute,
) -> Result<()> {
    let naming = Naming::Pairs {
        at: a.pairs.key(),
        flat: a.pairs.of(call),
    };
    let key = CallKey::new(call.name(), 0);
    let moved = on_group(call, library, naming, key, |place, seats| {
        collectives::permute(&place.group, library, backend, seats, &place.pairs)
    })?;
    match moved {
        Some(()) => Ok(()),
        None => backend.fill_zeros(call.ret(0)?.buf_mut()?), // named by no pair
    }
}

pub fn hlo_ragged_all_to_all(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloRaggedAllToAll,
) -> Result<()> {
    let row = call.arg(0)?.row() * call.arg(0)?.dtype()?.size();
    let key = CallKey::new(call.name(), 0);
    on_group(
        call,
        library,
        groups(call, &a.groups),
        key,
        |place, seats| {
            mesh::ragged::ragged_all_to_all(&place.group, library, backend, seats, row, call.name())
        },
    )
    .map(|_| ())
}

/// A program's prologue, before its first MPI call: the communicators its collectives need
/// among processes, made at its first run (`mesh/communicators.rs`).
pub fn hlo_communicators(
    call: &Call,
    library: &dyn Library,
    _: &dyn Backend,
    a: &attrs::HloCommunicators,
) -> Result<()> {
    mesh::make_program_communicators(library, a.groups.of(call))
}
