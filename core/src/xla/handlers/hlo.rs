//! XLA's collectives, as the HLO pass (`xla/hlo`) hands them over: an adapter per HLO
//! opcode, run on every device of the program, from the call frame to the device-rank
//! layer (`xla/mesh`), which runs every collective among devices. In checked mode the
//! group's devices first compare their calls, as the ranks of a communicator do.

use super::attrs;
use super::services::checked;
use crate::xla::frame::{Call, Devices, Operand};
use crate::xla::mesh::ON_DEVICES;
use crate::xla::mesh::{
    self, collectives, reductions, AllToAll, Group, Naming, OnDevices, Seat, Span, Spans,
};
use crate::{Backend, Error, Library, Result};

fn span(operand: &Operand) -> Result<Span> {
    Ok(Span {
        ptr: operand.data() as usize,
        count: operand.count(),
        dtype: operand.dtype()?,
    })
}

fn seat_of(call: &Call) -> Result<Seat> {
    Ok(Seat::of_buffers(
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
/// arrived (at once where the device is the only one). None: a pair names no such device.
fn on_group(
    call: &Call,
    library: &dyn Library,
    naming: Naming,
    run: impl FnOnce(&Group, &[Seat]) -> Result<()>,
) -> Result<Option<()>> {
    let Some((group, position)) = mesh::placed(library, naming, call.device()?)? else {
        return Ok(None);
    };
    if checked::enabled() {
        let ranks = OnDevices::in_group(crate::library()?, group.clone(), position);
        checked::collective(call, &ranks, ON_DEVICES)?;
    }
    group
        .meet(library, position, seat_of(call)?, |seats| {
            run(&group, seats)
        })
        .map(Some)
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
    on_group(call, library, groups(call, &a.groups), |group, seats| {
        reductions::all_reduce(group, library, backend, seats, a.op)
    })
    .map(|_| ())
}

pub fn hlo_all_gather(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloAllGather,
) -> Result<()> {
    on_group(call, library, groups(call, &a.groups), |group, seats| {
        collectives::all_gather(group, library, backend, seats, &a.outer.0)
    })
    .map(|_| ())
}

pub fn hlo_reduce_scatter(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloReduceScatter,
) -> Result<()> {
    on_group(call, library, groups(call, &a.groups), |group, seats| {
        reductions::reduce_scatter(group, library, backend, seats, &a.outer.0, a.op)
    })
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
    on_group(call, library, groups(call, &a.groups), |group, seats| {
        collectives::all_to_all(group, library, backend, seats, form)
    })
    .map(|_| ())
}

pub fn hlo_collective_permute(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloCollectivePermute,
) -> Result<()> {
    let flat = a.pairs.of(call);
    let naming = Naming::Pairs {
        at: a.pairs.key(),
        flat,
    };
    let moved = on_group(call, library, naming, |group, seats| {
        // The devices the pairs name are the group, in the order they first appear.
        let position = |d: i64| group.devices.iter().position(|&x| x == d).unwrap_or(0);
        let pairs: Vec<(usize, usize)> = flat
            .chunks(2)
            .map(|p| (position(p[0]), position(p[1])))
            .collect();
        collectives::permute(group, library, backend, seats, &pairs)
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
    on_group(call, library, groups(call, &a.groups), |group, seats| {
        mesh::ragged::ragged_all_to_all(group, library, backend, seats, row, call.name())
    })
    .map(|_| ())
}
