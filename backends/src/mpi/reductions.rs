//! The reductions: allreduce, reduce, scan, exscan, reduce_scatter. Each is one classic MPI
//! function called on `int`-sized segments (`in_segments`), so none needs large counts.

use std::ffi::{c_int, c_void};

use jaxmpi_core::{Buf, BufMut, Comm, Dtype, Input, ReduceOp, Result};

use super::abi::Abi;
use super::counts::INT_MAX;
use super::handles::{expect_len, same_dtype};
use super::library::MpiLibrary;

/// A reduction's MPI function, with its root (if any) bound, as called on one segment:
/// (send, recv, count, datatype, op, comm) -> MPI return code.
type ReduceFn<'f, H> = &'f dyn Fn(*const c_void, *mut c_void, c_int, H, H, H) -> c_int;

/// MPI_Allreduce, MPI_Scan and MPI_Exscan, which share one prototype.
pub(super) type Elementwise<H> =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, H, H, H) -> c_int;

/// Validates an elementwise reduction and runs `function` (named for errors) in segments.
fn reduction<A: Abi>(
    lib: &MpiLibrary<A>,
    (function, call): (&'static str, ReduceFn<A::Handle>),
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
    reduce_raw(lib, (function, call), comm, on, op)
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
    (function, call): (&'static str, ReduceFn<A::Handle>),
    comm: A::Handle,
    on: Operands,
    op: ReduceOp,
) -> Result<()> {
    let datatype = lib.pre.datatype(on.dtype);
    let op = lib.op(op, on.dtype)?;
    lib.in_segments(function, on.count, on.dtype, on.send, on.recv, |s, r, n| {
        call(s, r, n, datatype, op, comm)
    })
}

// SAFETY (every reduction below): pointers come from `Buf`/`BufMut`, valid for their
// counts, offset by `in_segments` within those counts.

/// allreduce, scan or exscan, which differ only in the MPI function (`function`, by name
/// and pointer).
pub(super) fn elementwise<A: Abi>(
    lib: &MpiLibrary<A>,
    (function, f): (&'static str, Elementwise<A::Handle>),
    comm: Comm,
    send: Input,
    recv: BufMut,
    op: ReduceOp,
) -> Result<()> {
    // SAFETY: as the note above `elementwise` says.
    let call: ReduceFn<A::Handle> = &|s, r, n, t, o, c| unsafe { f(s, r, n, t, o, c) };
    reduction(lib, (function, call), comm, send, &recv, op)
}

pub(super) fn reduce<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: Comm,
    send: Input,
    recv: BufMut,
    op: ReduceOp,
    root: i32,
) -> Result<()> {
    let rooted = lib.rooted_comm(comm, root)?;
    let f = lib.fns.MPI_Reduce;
    // SAFETY: as the note above `elementwise` says.
    let call: ReduceFn<A::Handle> = &|s, r, n, t, o, c| unsafe { f(s, r, n, t, o, root, c) };
    let function = ("MPI_Reduce", call);
    if rooted.at_root {
        // A copy of the input stands in for MPI_IN_PLACE where the library crashes on it.
        let copy: Vec<u8>;
        let send = match send {
            Input::InPlace if root != 0 && lib.quirks.reduce_in_place_off_rank_0_crashes => {
                // SAFETY: `recv` is valid for reads of its length.
                let input = unsafe { std::slice::from_raw_parts(recv.ptr(), recv.len_bytes()) };
                copy = input.to_vec();
                Input::Data(Buf::from_bytes(&copy, recv.dtype())?)
            }
            other => other,
        };
        return reduction(lib, function, comm, send, &recv, op);
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
        // SAFETY: send holds size*block elements, recv holds block.
        let rc = unsafe {
            (lib.fns.MPI_Reduce_scatter_block)(
                send.ptr().cast(),
                recv.ptr().cast(),
                block as c_int,
                datatype,
                op,
                handle,
            )
        };
        return lib.check("MPI_Reduce_scatter_block", rc);
    }
    // Blocks too large for one call: reduce each block to its owner, in segments.
    let rank = lib.comm_rank_raw(handle)? as usize;
    let f = lib.fns.MPI_Reduce;
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
        let root = owner as c_int;
        // SAFETY: as the note above `elementwise` says.
        let call: ReduceFn<A::Handle> = &|s, r, n, t, o, c| unsafe { f(s, r, n, t, o, root, c) };
        reduce_raw(lib, ("MPI_Reduce", call), handle, on, op)?;
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
    let f = lib.fns.MPI_Reduce_local;
    let datatype = lib.pre.datatype(dst.dtype());
    let op = lib.op(op, dst.dtype())?;
    let (send, recv) = (src.ptr().cast(), dst.ptr().cast());
    lib.in_segments(
        "MPI_Reduce_local",
        dst.count(),
        dst.dtype(),
        send,
        recv,
        |s, r, n| {
            // SAFETY: `in_segments` hands segments within both buffers' counts.
            unsafe { f(s, r, n, datatype, op) }
        },
    )
}
