//! XLA's collectives, as the HLO pass (`xla/hlo`) hands them over: one body per HLO
//! opcode, run on every device of the program. Each finds its group from its device
//! (`device_groups.rs`); where each device of the group is a process of its own it is one
//! MPI collective on the device's own buffers, otherwise the devices of this process meet
//! and move the data as a plan of copies and point-to-point messages
//! (`device_groups::exchange`), reductions first combining this process's parts.
//!
//! Layouts: the pass gives, per operand, how many slices lie outside the dimension the
//! collective works along (`outer`); within a slice the group's blocks are back to back.

use std::sync::Arc;

use super::attrs;
use super::call::Operand;
use super::device_groups::{self, exchange, Group, Naming, Piece, Seat, Span};
use super::signature::Devices;
use super::Call;
use crate::{Backend, Envelope, Error, Input, Library, Peer, Result, ThreadLevel};

fn span(operand: &Operand) -> Result<Span> {
    Ok(Span {
        ptr: operand.data() as usize,
        count: operand.count(),
        dtype: operand.dtype()?,
    })
}

fn seat_of(call: &Call) -> Result<Seat> {
    Ok(Seat {
        args: (0..call.args_len())
            .map(|i| span(&call.arg(i)?))
            .collect::<Result<_>>()?,
        rets: (0..call.rets_len())
            .map(|i| span(&call.ret(i)?))
            .collect::<Result<_>>()?,
    })
}

/// The group this call's device belongs to, and its position there.
fn placed(call: &Call, library: &dyn Library, groups: &Devices) -> Result<(Arc<Group>, usize)> {
    device_groups::placed(call, library, groups, Naming::Groups)?.ok_or_else(|| {
        Error::invalid_argument(
            call.name(),
            "the device is in none of the collective's groups",
        )
    })
}

/// Runs `run` once for this process's devices of the group: at once when this device is
/// the only one, else when all of them have arrived, with their seats in position order.
fn on_process(
    call: &Call,
    library: &dyn Library,
    group: &Group,
    position: usize,
    run: impl FnOnce(&[Seat]) -> Result<()>,
) -> Result<()> {
    let seat = seat_of(call)?;
    if group.local.len() == 1 {
        return run(&[seat]);
    }
    if library.thread_level() < ThreadLevel::Multiple {
        return Err(Error::unsupported(
            call.name(),
            "several devices of this process call MPI at once, which needs \
             MPI_THREAD_MULTIPLE: let jaxmpi or mpi4py initialize MPI (both ask for it)",
        ));
    }
    group.meet(position, seat, run)
}

/// Copies `from` to `to` unless they are the same memory.
fn copy(from: &Span, to: &Span) {
    if from.ptr != to.ptr && from.bytes() > 0 {
        // SAFETY: both are live buffers of calls now running, `bytes` long.
        unsafe { std::ptr::copy(from.ptr as *const u8, to.ptr as *mut u8, from.bytes()) };
    }
}

/// The seat of local `position` (seats come in the order of `group.local`).
fn seat<'s>(group: &Group, seats: &'s [Seat], position: usize) -> &'s Seat {
    &seats[group.slot(position)]
}

/// An address inside a seat's buffer, where that position is local (else 0, never used).
fn at(
    group: &Group,
    seats: &[Seat],
    position: usize,
    pick: impl Fn(&Seat) -> Span,
    offset: usize,
) -> usize {
    if group.is_local(position) {
        pick(seat(group, seats, position)).ptr + offset
    } else {
        0
    }
}

pub fn hlo_all_reduce(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloAllReduce,
) -> Result<()> {
    let (group, position) = placed(call, library, &a.groups)?;
    on_process(call, library, &group, position, |seats| {
        let lead = &seats[0];
        for (k, y) in lead.rets.iter().enumerate() {
            copy(&lead.args[k], y);
            for other in &seats[1..] {
                // SAFETY: live buffers of the meeting devices' calls.
                unsafe { backend.reduce_local(other.args[k].buf(), y.buf_mut(), a.op)? };
            }
            if group.spans_processes() {
                // SAFETY: as above.
                let y_buf = unsafe { y.buf_mut() };
                backend.allreduce(group.comm(library)?, Input::InPlace, y_buf, a.op)?;
            }
            for other in &seats[1..] {
                copy(y, &other.rets[k]);
            }
        }
        Ok(())
    })
}

pub fn hlo_all_gather(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloAllGather,
) -> Result<()> {
    let (group, position) = placed(call, library, &a.groups)?;
    let n = group.size();
    on_process(call, library, &group, position, |seats| {
        let mut pieces = Vec::new();
        for (k, &outer) in a.outer.0.iter().enumerate() {
            let (x, y) = (seats[0].args[k], seats[0].rets[k]);
            if group.distinct() && outer == 1 && group.spans_processes() {
                // SAFETY: live buffers of this device's call.
                let (send, recv) = unsafe { (x.buf(), y.buf_mut()) };
                backend.allgather(group.comm(library)?, send, recv)?;
                continue;
            }
            // Member i's slice o lands as block i of every member's slice o.
            let blocks = Blocks {
                k,
                outer,
                bytes: x.bytes() / outer.max(1),
            };
            pieces.extend(blocks.between_all(&group, seats, |_, _, o| o, |i, _, o| o * n + i));
        }
        exchange(&group, library, backend, &pieces)
    })
}

/// Equal blocks of operand and result `k`, in `outer` slices, that every member sends
/// every member (all-gather, all-to-all along a dimension).
struct Blocks {
    k: usize,
    outer: usize,
    bytes: usize,
}

impl Blocks {
    /// From each member i to each member j, for each slice o: the block at block index
    /// `send(i, j, o)` of i's operand to block index `recv(i, j, o)` of j's result.
    fn between_all(
        &self,
        group: &Group,
        seats: &[Seat],
        send: impl Fn(usize, usize, usize) -> usize,
        recv: impl Fn(usize, usize, usize) -> usize,
    ) -> Vec<Piece> {
        let (n, k, bytes) = (group.size(), self.k, self.bytes);
        let mut pieces = Vec::with_capacity(n * n * self.outer);
        for i in 0..n {
            for j in 0..n {
                for o in 0..self.outer {
                    pieces.push(Piece {
                        from: i,
                        to: j,
                        bytes,
                        send: at(group, seats, i, |s| s.args[k], send(i, j, o) * bytes),
                        recv: at(group, seats, j, |s| s.rets[k], recv(i, j, o) * bytes),
                    });
                }
            }
        }
        pieces
    }
}

/// A buffer for a reduction's whole operand, aligned for any element type.
fn scratch(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8)]
}

pub fn hlo_reduce_scatter(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloReduceScatter,
) -> Result<()> {
    let (group, position) = placed(call, library, &a.groups)?;
    let n = group.size();
    on_process(call, library, &group, position, |seats| {
        for (k, &outer) in a.outer.0.iter().enumerate() {
            let (x, y) = (seats[0].args[k], seats[0].rets[k]);
            if group.distinct() && outer == 1 && group.spans_processes() {
                // SAFETY: live buffers of this device's call.
                let (send, recv) = unsafe { (x.buf(), y.buf_mut()) };
                backend.reduce_scatter(group.comm(library)?, send, recv, a.op)?;
                continue;
            }
            // The whole operand reduced over every device, then each device's block
            // taken from it.
            let mut whole = scratch(x.bytes());
            let total = Span {
                ptr: whole.as_mut_ptr() as usize,
                ..x
            };
            copy(&x, &total);
            for other in &seats[1..] {
                // SAFETY: live buffers of the meeting calls, and `whole`.
                unsafe { backend.reduce_local(other.args[k].buf(), total.buf_mut(), a.op)? };
            }
            if group.spans_processes() {
                // SAFETY: `whole` is ours.
                let buf = unsafe { total.buf_mut() };
                backend.allreduce(group.comm(library)?, Input::InPlace, buf, a.op)?;
            }
            let inner = y.bytes() / outer.max(1);
            let mut pieces = Vec::new();
            for &p in &group.local {
                for o in 0..outer {
                    pieces.push(Piece {
                        from: p,
                        to: p,
                        bytes: inner,
                        send: total.ptr + (o * n + p) * inner,
                        recv: seat(&group, seats, p).rets[k].ptr + o * inner,
                    });
                }
            }
            exchange(&group, library, backend, &pieces)?;
        }
        Ok(())
    })
}

pub fn hlo_all_to_all(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloAllToAll,
) -> Result<()> {
    let (group, position) = placed(call, library, &a.groups)?;
    let n = group.size();
    on_process(call, library, &group, position, |seats| {
        let mut pieces = Vec::new();
        match a.outer.0[..] {
            // One array per member: the i-th operand goes to member i, the j-th result
            // comes from member j.
            [] => {
                let bytes = seats[0].args.first().map_or(0, Span::bytes);
                for i in 0..n {
                    for j in 0..n {
                        pieces.push(Piece {
                            from: i,
                            to: j,
                            bytes,
                            send: at(&group, seats, i, |s| s.args[j], 0),
                            recv: at(&group, seats, j, |s| s.rets[i], 0),
                        });
                    }
                }
            }
            [outer] => {
                let (x, y) = (seats[0].args[0], seats[0].rets[0]);
                if group.distinct() && outer == 1 && group.spans_processes() {
                    // SAFETY: live buffers of this device's call.
                    let (send, recv) = unsafe { (x.buf(), y.buf_mut()) };
                    return backend.alltoall(group.comm(library)?, send, recv);
                }
                // Member i's chunk j of slice o lands as chunk i of member j's slice o.
                let blocks = Blocks {
                    k: 0,
                    outer,
                    bytes: x.bytes() / (outer.max(1) * n),
                };
                let (send, recv) = (|_, j, o| o * n + j, |i, _, o| o * n + i);
                pieces.extend(blocks.between_all(&group, seats, send, recv));
            }
            _ => {
                return Err(Error::invalid_argument(
                    call.name(),
                    "outer: one size at most",
                ))
            }
        }
        exchange(&group, library, backend, &pieces)
    })
}

pub fn hlo_collective_permute(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloCollectivePermute,
) -> Result<()> {
    let y = call.ret(0)?;
    // The devices the pairs name are one group, whose devices of this process meet.
    let Some((group, position)) = device_groups::placed(call, library, &a.pairs, Naming::Pairs)?
    else {
        return backend.fill_zeros(y.buf_mut()?); // named by no pair: nothing arrives
    };
    let pairs = a.pairs.of(call);
    let at_position = |d: i64| group.devices.iter().position(|&x| x == d).unwrap_or(0);
    let pairs: Vec<(usize, usize)> = pairs
        .chunks(2)
        .map(|p| (at_position(p[0]), at_position(p[1])))
        .collect();
    if group.local.len() == 1 && group.distinct() {
        // One MPI call, as jaxmpi.sendrecv makes: to this device's target, from its source.
        let (x, y) = (call.arg(0)?, call.ret(0)?);
        let target = pairs.iter().find(|p| p.0 == position).map(|p| p.1);
        let source = pairs.iter().find(|p| p.1 == position).map(|p| p.0);
        // Made by every process the pairs name (MPI_Comm_create_group is collective over
        // them), a device that only keeps its own piece included: the others wait in it.
        let comm = group.comm(library)?;
        if source.is_none() {
            backend.fill_zeros(y.buf_mut()?)?;
        }
        if target == Some(position) {
            copy(&span(&x)?, &span(&y)?); // a pair from itself to itself
            return Ok(());
        }
        let peer = |p: Option<usize>| p.map_or(Peer::Null, |p| Peer::Rank(group.rank_of(p)));
        let envelope = Envelope {
            comm,
            dest: peer(target),
            sendtag: 0,
            source: peer(source),
            recvtag: Some(0),
        };
        return backend
            .sendrecv(Input::Data(x.buf()?), y.buf_mut()?, envelope)
            .map(|_| ());
    }
    on_process(call, library, &group, position, |seats| {
        for &p in &group.local {
            if !pairs.iter().any(|&(_, t)| t == p) {
                // SAFETY: a live result of a meeting call.
                backend.fill_zeros(unsafe { seat(&group, seats, p).rets[0].buf_mut() })?;
            }
        }
        let bytes = seats[0].args[0].bytes();
        let pieces: Vec<Piece> = pairs
            .iter()
            .map(|&(from, to)| Piece {
                from,
                to,
                bytes,
                send: at(&group, seats, from, |s| s.args[0], 0),
                recv: at(&group, seats, to, |s| s.rets[0], 0),
            })
            .collect();
        exchange(&group, library, backend, &pieces)
    })
}

/// A ragged exchange's offsets or sizes operand, in rows.
fn rows(call: &Call, span: &Span, what: &str) -> Result<Vec<usize>> {
    // SAFETY: a live operand of a meeting call.
    let values = integers(unsafe { span.buf() }, call, what)?;
    values
        .into_iter()
        .map(|v| {
            usize::try_from(v).map_err(|_| {
                Error::invalid_argument(call.name(), format!("{what} holds {v}, below zero"))
            })
        })
        .collect()
}

fn integers(buf: crate::Buf, call: &Call, what: &str) -> Result<Vec<i64>> {
    let (ptr, count) = (buf.ptr(), buf.count());
    Ok(match buf.dtype() {
        crate::Dtype::I64 => {
            // SAFETY: `count` int64 values, alive for the call.
            unsafe { std::slice::from_raw_parts(ptr.cast::<i64>(), count) }.to_vec()
        }
        crate::Dtype::I32 => {
            // SAFETY: `count` int32 values, alive for the call.
            let values = unsafe { std::slice::from_raw_parts(ptr.cast::<i32>(), count) };
            values.iter().map(|&v| i64::from(v)).collect()
        }
        other => {
            return Err(Error::invalid_argument(
                call.name(),
                format!("{what} must be int32 or int64, is {other}"),
            ))
        }
    })
}

pub fn hlo_ragged_all_to_all(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::HloRaggedAllToAll,
) -> Result<()> {
    let (group, position) = placed(call, library, &a.groups)?;
    let n = group.size();
    let row = call.arg(0)?.row() * call.arg(0)?.dtype()?.size();
    on_process(call, library, &group, position, |seats| {
        // Per local slot: where its rows go, what it sends, where the rows it receives go.
        struct Plan {
            input_offsets: Vec<usize>,
            send_sizes: Vec<usize>,
            recv_sizes: Vec<usize>,
            offsets_out: Vec<i64>,
            offsets_in: Vec<i64>,
        }
        let mut plans = Vec::new();
        for s in seats {
            copy(&s.args[1], &s.rets[0]);
            let plan = Plan {
                input_offsets: rows(call, &s.args[2], "input_offsets")?,
                send_sizes: rows(call, &s.args[3], "send_sizes")?,
                offsets_out: rows(call, &s.args[4], "output_offsets")?
                    .into_iter()
                    .map(|v| v as i64)
                    .collect(),
                recv_sizes: rows(call, &s.args[5], "recv_sizes")?,
                offsets_in: vec![0; n],
            };
            for (what, list) in [
                ("input_offsets", plan.input_offsets.len()),
                ("send_sizes", plan.send_sizes.len()),
                ("output_offsets", plan.offsets_out.len()),
                ("recv_sizes", plan.recv_sizes.len()),
            ] {
                if list != n {
                    return Err(Error::invalid_argument(
                        call.name(),
                        format!("{what} has {list} entries for a group of {n}"),
                    ));
                }
            }
            let input_rows = s.args[0].bytes() / row.max(1);
            for j in 0..n {
                if plan.input_offsets[j] + plan.send_sizes[j] > input_rows {
                    return Err(Error::invalid_argument(
                        call.name(),
                        format!(
                            "rows {}..{} sent to member {j} lie outside the input's {input_rows}",
                            plan.input_offsets[j],
                            plan.input_offsets[j] + plan.send_sizes[j]
                        ),
                    ));
                }
            }
            plans.push(plan);
        }
        let slot = |p: usize| group.slot(p);
        // First every sender tells every receiver where its rows go.
        let mut meta = Vec::new();
        for i in 0..n {
            for j in 0..n {
                meta.push(Piece {
                    from: i,
                    to: j,
                    bytes: 8,
                    send: if group.is_local(i) {
                        &plans[slot(i)].offsets_out[j] as *const i64 as usize
                    } else {
                        0
                    },
                    recv: if group.is_local(j) {
                        &plans[slot(j)].offsets_in[i] as *const i64 as usize
                    } else {
                        0
                    },
                });
            }
        }
        exchange(&group, library, backend, &meta)?;
        let mut data = Vec::new();
        for i in 0..n {
            for j in 0..n {
                let (sends, receives) = (group.is_local(i), group.is_local(j));
                let rows = if sends {
                    plans[slot(i)].send_sizes[j]
                } else if receives {
                    plans[slot(j)].recv_sizes[i]
                } else {
                    continue;
                };
                let mut recv = 0;
                if receives {
                    let (s, plan) = (&seats[slot(j)], &plans[slot(j)]);
                    let offset = usize::try_from(plan.offsets_in[i]).unwrap_or(usize::MAX);
                    let output_rows = s.rets[0].bytes() / row.max(1);
                    if offset.saturating_add(rows) > output_rows {
                        return Err(Error::invalid_argument(
                            call.name(),
                            format!("rows {offset}.. from member {i} lie outside the output's {output_rows}"),
                        ));
                    }
                    recv = s.rets[0].ptr + offset * row;
                }
                let send = if sends {
                    seats[slot(i)].args[0].ptr + plans[slot(i)].input_offsets[j] * row
                } else {
                    0
                };
                data.push(Piece {
                    from: i,
                    to: j,
                    bytes: rows * row,
                    send,
                    recv,
                });
            }
        }
        exchange(&group, library, backend, &data)
    })
}
