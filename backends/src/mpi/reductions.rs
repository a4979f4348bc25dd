//! The reductions: allreduce, reduce, scan, exscan, reduce_scatter. Each is one classic MPI
//! function called on `int`-sized segments (`in_segments`), so none needs large counts.

use std::ffi::{c_int, c_void};

use jaxmpi_core::{Buf, BufMut, Comm, Dtype, Input, ReduceOp, Result};

use super::abi::Abi;
use super::counts::INT_MAX;
use super::handles::{expect_len, same_dtype};
use super::library::MpiLibrary;
use super::{ring, starting};
use crate::chunks;

/// A reduction's MPI function, with its root (if any) bound, as called on one segment:
/// (send, recv, count, datatype, op, comm, request) -> MPI return code; given a request,
/// its non-blocking twin (`starting.rs`).
type ReduceFn<'f, H> =
    &'f dyn Fn(*const c_void, *mut c_void, c_int, H, H, H, Option<&mut H>) -> c_int;

/// MPI_Allreduce, MPI_Scan and MPI_Exscan, which share one prototype.
pub(super) type Elementwise<H> =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, H, H, H) -> c_int;
/// Their non-blocking twins: the same, then the request.
pub(super) type StartedElementwise<H> =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, H, H, H, *mut H) -> c_int;

/// An elementwise reduction's MPI function and its non-blocking twin, with their names.
pub(super) struct Pair<H> {
    pub names: starting::Names,
    pub blocking: Elementwise<H>,
    pub started: StartedElementwise<H>,
}

/// Validates an elementwise reduction and runs the function `names` names in segments.
fn reduction<A: Abi>(
    lib: &MpiLibrary<A>,
    (names, call): (starting::Names, ReduceFn<A::Handle>),
    comm: Comm,
    send: Input,
    recv: &BufMut,
    op: ReduceOp,
) -> Result<()> {
    let comm = lib.comm(comm)?;
    if let Input::Data(buf) = &send {
        same_dtype(buf, recv)?;
        expect_len("the receive buffer", recv.count(), buf.count())?;
    }
    let on = Operands {
        send: lib.input_ptr(&send),
        recv: recv.ptr().cast(),
        count: recv.count(),
        dtype: recv.dtype(),
    };
    reduce_raw(lib, (names, call), comm, on, op)
}

/// `count` elements of `dtype` reduced from `send` (or MPI_IN_PLACE) into `recv` (null
/// away from a root).
struct Operands {
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: Dtype,
}

fn reduce_raw<A: Abi>(
    lib: &MpiLibrary<A>,
    (names, call): (starting::Names, ReduceFn<A::Handle>),
    comm: A::Handle,
    on: Operands,
    op: ReduceOp,
) -> Result<()> {
    let datatype = lib.pre.datatype(on.dtype);
    let op = lib.op(op, on.dtype)?;
    lib.in_segments(names, on.count, on.dtype, on.send, on.recv, |s, r, n, q| {
        call(s, r, n, datatype, op, comm, q)
    })
}

// SAFETY (every reduction below): pointers come from `Buf`/`BufMut`, valid for their
// counts, offset by `in_segments` within those counts; a request handle is one writable
// handle.

/// allreduce, scan or exscan, which differ only in the MPI functions (`pair`).
pub(super) fn elementwise<A: Abi>(
    lib: &MpiLibrary<A>,
    pair: &Pair<A::Handle>,
    comm: Comm,
    send: Input,
    recv: BufMut,
    op: ReduceOp,
) -> Result<()> {
    let (f, started) = (pair.blocking, pair.started);
    let call: ReduceFn<A::Handle> = &|s, r, n, t, o, c, request| match request {
        // SAFETY: as the note above `elementwise` says.
        None => unsafe { f(s, r, n, t, o, c) },
        // SAFETY: as the note above `elementwise` says.
        Some(q) => unsafe { started(s, r, n, t, o, c, q) },
    };
    reduction(lib, (pair.names, call), comm, send, &recv, op)
}

/// From this many bytes a rank's block, an allreduce of one of jaxmpi's own ops goes
/// round a ring (`ring.rs`) on a library that gives user-defined ops recursive doubling;
/// below it, recursive doubling's log2(ranks) exchanges beat the ring's 2 (ranks - 1)
/// (benches/RESULTS.md, issue 58).
const RING_BLOCK_FROM: usize = 64 << 10;
/// The smallest allreduce that may go round a ring: two ranks' blocks.
pub(super) const RING_FROM: usize = 2 * RING_BLOCK_FROM;

/// An allreduce of at least `RING_FROM` bytes, in the chunks every rank cuts (`chunks`),
/// each round a ring where that is what the library would do for a predefined op, else
/// `pair`'s call. Out of line: the small calls' path stays as it was.
#[inline(never)]
pub(super) fn large_allreduce<A: Abi>(
    lib: &MpiLibrary<A>,
    pair: &Pair<A::Handle>,
    comm: Comm,
    send: Input,
    mut recv: BufMut,
    op: ReduceOp,
) -> Result<()> {
    // The communicator, its size and the own op, where the ring may serve.
    let mut ring = None;
    if lib.quirks.user_op_allreduce_by_recursive_doubling && !starting::active() {
        if let Some(own) = lib.own_op(op, recv.dtype()) {
            let handle = lib.comm(comm)?;
            ring = Some((handle, lib.size_of(handle)?, own));
        }
    }
    let datatype = (lib.pre.datatype(recv.dtype()), recv.dtype().size());
    let pieces = chunks::spans(recv.count(), recv.dtype().size(), chunks::CHUNK_BYTES);
    chunks::each_span(pieces, |start, n| {
        let (send, part) = (send.part(start, n), recv.part(start, n));
        match ring {
            Some((handle, ranks, own))
                if ranks > 1 && part.len_bytes() / ranks >= RING_BLOCK_FROM =>
            {
                let (out, count) = (part.ptr().cast(), part.count());
                ring::allreduce(lib, handle, &send, out, count, datatype, own)
            }
            _ => elementwise(lib, pair, comm, send, part, op),
        }
    })
}

/// A segment's call as `ReduceFn` takes it, as a value of its own.
trait SegmentCall<H>: Fn(*const c_void, *mut c_void, c_int, H, H, H, Option<&mut H>) -> c_int {}
impl<H, F> SegmentCall<H> for F where
    F: Fn(*const c_void, *mut c_void, c_int, H, H, H, Option<&mut H>) -> c_int
{
}

/// MPI_Reduce (or, given a request, MPI_Ireduce) to `root`, on one segment.
fn reduce_to<A: Abi>(lib: &MpiLibrary<A>, root: c_int) -> impl SegmentCall<A::Handle> {
    let (f, started) = (lib.fns.MPI_Reduce, lib.fns.MPI_Ireduce);
    move |s, r, n, t, o, c, request| match request {
        // SAFETY: as the note above `elementwise` says.
        None => unsafe { f(s, r, n, t, o, root, c) },
        // SAFETY: as the note above `elementwise` says.
        Some(q) => unsafe { started(s, r, n, t, o, root, c, q) },
    }
}

const REDUCE: starting::Names = ("MPI_Reduce", "MPI_Ireduce");

pub(super) fn reduce<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Input,
    recv: BufMut,
    op: ReduceOp,
    root: i32,
) -> Result<()> {
    let rooted = lib.rooted_comm(comm, root)?;
    let call = reduce_to(lib, root);
    let function = (REDUCE, &call as ReduceFn<A::Handle>);
    if rooted.at_root {
        // A copy of the input stands in for MPI_IN_PLACE where the library crashes on it
        // (kept until a started reduction completes).
        let mut copy: Option<Vec<u8>> = None;
        let send = match send {
            Input::InPlace if root != 0 && lib.quirks.reduce_in_place_off_rank_0_crashes => {
                // SAFETY: `recv` is valid for reads of its length.
                let input = unsafe { std::slice::from_raw_parts(recv.ptr(), recv.len_bytes()) };
                let copy = copy.insert(input.to_vec());
                Input::Data(Buf::from_bytes(copy, recv.dtype())?)
            }
            other => other,
        };
        let reduced = reduction(lib, function, comm, send, &recv, op);
        if let Some(copy) = copy {
            starting::keep(copy);
        }
        return reduced;
    }
    // Away from the root only the input matters; "in place" there means the input is
    // in the receive buffer.
    let (send, count, dtype): (*const c_void, _, _) = match send {
        Input::Data(buf) => (buf.ptr().cast(), buf.count(), buf.dtype()),
        Input::InPlace => (recv.ptr().cast_const().cast(), recv.count(), recv.dtype()),
    };
    let recv = std::ptr::null_mut();
    let on = Operands {
        send,
        recv,
        count,
        dtype,
    };
    reduce_raw(lib, function, rooted.handle, on, op)
}

pub(super) fn reduce_scatter<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Buf,
    recv: BufMut,
    op: ReduceOp,
) -> Result<()> {
    let handle = lib.comm(comm)?;
    same_dtype(&send, &recv)?;
    let size = lib.size_of(handle)?;
    let block = recv.count();
    expect_len("the send buffer", send.count(), size * block)?;
    if block <= INT_MAX {
        let datatype = lib.pre.datatype(recv.dtype());
        let op = lib.op(op, recv.dtype())?;
        let (s, r, n) = (send.ptr().cast(), recv.ptr().cast(), block as c_int);
        let (f, started) = (
            lib.fns.MPI_Reduce_scatter_block,
            lib.fns.MPI_Ireduce_scatter_block,
        );
        let names = ("MPI_Reduce_scatter_block", "MPI_Ireduce_scatter_block");
        return lib.call_or_start(names, None, |request| match request {
            // SAFETY: send holds size*block elements, recv holds block.
            None => unsafe { f(s, r, n, datatype, op, handle) },
            // SAFETY: as above; `q` is one writable request handle.
            Some(q) => unsafe { started(s, r, n, datatype, op, handle, q) },
        });
    }
    // Blocks too large for one call: reduce each block to its owner, in segments.
    let rank = lib.comm_rank_raw(handle)? as usize;
    for owner in 0..size {
        let on = Operands {
            send: send
                .ptr()
                .wrapping_add(owner * block * send.dtype().size())
                .cast(),
            recv: if owner == rank {
                recv.ptr().cast()
            } else {
                std::ptr::null_mut()
            },
            count: block,
            dtype: recv.dtype(),
        };
        let call = reduce_to(lib, owner as c_int);
        reduce_raw(lib, (REDUCE, &call), handle, on, op)?;
    }
    Ok(())
}

/// MPI_Reduce_local: `dst = src op dst` on this process, in `int`-sized segments.
pub(super) fn reduce_local<A: Abi>(
    lib: &MpiLibrary<A>,
    src: Buf,
    dst: BufMut,
    op: ReduceOp,
) -> Result<()> {
    same_dtype(&src, &dst)?;
    expect_len("the destination", dst.count(), src.count())?;
    // Local work, done at once: no request to start.
    lib.refuses_to_start("MPI_Reduce_local")?;
    let f = lib.fns.MPI_Reduce_local;
    let datatype = lib.pre.datatype(dst.dtype());
    let op = lib.op(op, dst.dtype())?;
    let (send, recv) = (src.ptr().cast(), dst.ptr().cast());
    let names = ("MPI_Reduce_local", "MPI_Reduce_local");
    lib.in_segments(names, dst.count(), dst.dtype(), send, recv, |s, r, n, _| {
        // SAFETY: `in_segments` hands segments within both buffers' counts.
        unsafe { f(s, r, n, datatype, op) }
    })
}
