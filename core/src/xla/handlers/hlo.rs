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

/// Which operand a call reads in place of which result (the memory both may be), if any.
type InPlace = fn(usize, usize) -> bool;

/// No operand is read in place of a result.
fn apart(_: usize, _: usize) -> bool {
    false
}

/// Copies aside, into `aside`, every operand of `seat` that shares memory with a result it
/// is not read in place of. XLA inserted its copies before the pass, for its own
/// collectives, which may read an operand in the memory they write (a loop's state, say);
/// the calls that stand for them move data between processes while they still read it,
/// and MPI refuses one buffer for both.
fn set_apart(seat: &mut Seat, in_place: InPlace, aside: &mut Vec<Vec<u128>>) {
    for (a, arg) in seat.args.iter_mut().enumerate() {
        let shared = seat.rets.iter().enumerate().any(|(r, ret)| {
            let as_itself = in_place(a, r) && (arg.ptr, arg.bytes()) == (ret.ptr, ret.bytes());
            arg.overlaps(ret) && !as_itself
        });
        if shared {
            let mut copy = vec![0u128; arg.bytes().div_ceil(16)];
            // SAFETY: a live operand of this call, `bytes` long, into memory of its own.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    arg.ptr as *const u8,
                    copy.as_mut_ptr() as *mut u8,
                    arg.bytes(),
                )
            };
            arg.ptr = copy.as_ptr() as usize;
            aside.push(copy);
        }
    }
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
    in_place: InPlace,
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
    let mut seat = seat_of(call, key.and(place.detail))?;
    // Outlives the meeting, which reads it.
    let mut aside = Vec::new();
    set_apart(&mut seat, in_place, &mut aside);
    group
        .meet(place.position, seat, |seats| run(&place, seats))
        .map(Some)
}

/// The key of a call that works along a dimension with `outer` slices outside it.
fn along(call: &Call, outer: &[usize]) -> CallKey {
    let slices = outer
        .iter()
        .fold(outer.len() as u64, |h, &o| h.rotate_left(17) ^ o as u64);
    CallKey::new(call.name(), slices)
}

/// `on_group` for a call whose attribute `groups` lists its groups.
fn on_groups(
    call: &Call,
    library: &dyn Library,
    groups: &Devices,
    key: CallKey,
    in_place: InPlace,
    run: impl FnOnce(&Place, &[Seat]) -> Result<()>,
) -> Result<()> {
    let naming = Naming::Groups {
        at: groups.key(),
        flat: groups.of(call),
    };
    on_group(call, library, naming, key, in_place, run).map(|_| ())
}

/// Each array read in place of its own result (where the pass found it may be).
fn own(arg: usize, ret: usize) -> bool {
    arg == ret
}

pub fn hlo_all_reduce(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloAllReduce,
) -> Result<()> {
    let key = CallKey::reducing(call.name(), a.op, 0);
    on_groups(call, library, &a.groups, key, own, |place, seats| {
        reductions::all_reduce(&place.group, backend, seats, a.op)
    })
}

pub fn hlo_all_gather(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloAllGather,
) -> Result<()> {
    let key = along(call, &a.outer.0);
    on_groups(call, library, &a.groups, key, apart, |place, seats| {
        collectives::all_gather(&place.group, library, backend, seats, &a.outer.0)
    })
}

pub fn hlo_reduce_scatter(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloReduceScatter,
) -> Result<()> {
    let key = CallKey::reducing(call.name(), a.op, along(call, &a.outer.0).detail);
    on_groups(call, library, &a.groups, key, apart, |place, seats| {
        reductions::reduce_scatter(&place.group, backend, seats, &a.outer.0, a.op)
    })
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
    on_groups(
        call,
        library,
        &a.groups,
        along(call, &a.outer.0),
        apart,
        |place, seats| collectives::all_to_all(&place.group, library, backend, seats, form),
    )
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
    let moved = on_group(call, library, naming, key, apart, |place, seats| {
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
    // The output's initial contents read in place of the result (where the pass found it
    // may be).
    let output = |arg, ret| (arg, ret) == (1, 0);
    on_groups(call, library, &a.groups, key, output, |place, seats| {
        mesh::ragged::ragged_all_to_all(&place.group, library, backend, seats, row, call.name())
    })
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
