//! Op bodies: which operands, results and attributes each op has, and the backend call.
//! Result conventions follow mpi4jax: ranks that receive nothing return their input. The
//! rooted ops bind no result on those ranks (the Python side returns the input), so the
//! presence of a result is what tells a body whether this rank receives.

use super::call::Operand;
use super::Call;
use crate::{
    Backend, Broadcast, Buf, BufMut, Dtype, Envelope, Input, Library, Partition, PartitionMut,
    Result, Status,
};

fn empty_buf<'a>(dtype: Dtype) -> Buf<'a> {
    // SAFETY: zero elements: nothing is ever read.
    unsafe { Buf::from_raw(std::ptr::null(), 0, dtype) }
}

fn empty_buf_mut<'a>(dtype: Dtype) -> BufMut<'a> {
    // SAFETY: zero elements: nothing is ever written.
    unsafe { BufMut::from_raw(std::ptr::null_mut(), 0, dtype) }
}

fn is_root(call: &Call, library: &dyn Library, root: i32) -> Result<bool> {
    Ok(library.comm_rank(call.comm()?)? == root)
}

/// Copies the library's MPI_Status into the mpi4py `Status` whose address the lowering
/// passed, so `status.Get_source()` etc. work after a jitted receive.
fn fill_status(call: &Call, status: &Status) -> Result<()> {
    let address = call.address("status")?;
    if address != 0 {
        let native = status.native.as_bytes();
        // SAFETY: the lowering passes the address of the MPI_Status inside a live mpi4py
        // Status object of the same library, which is exactly `native.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(native.as_ptr(), address as *mut u8, native.len()) };
    }
    Ok(())
}

pub fn jaxmpi_allreduce(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let recv = call.ret(0)?.buf_mut(call.op())?;
    backend.allreduce(
        call.comm()?,
        call.reduction_input()?,
        recv,
        call.reduce_op()?,
    )
}

pub fn jaxmpi_reduce(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (comm, op, root) = (call.comm()?, call.reduce_op()?, call.int("root")?);
    match call.optional_ret(0) {
        Some(y) => backend.reduce(
            comm,
            call.reduction_input()?,
            y.buf_mut(call.op())?,
            op,
            root,
        ),
        None => {
            let x = call.arg(0)?;
            let send = Input::Data(x.buf(call.op())?);
            backend.reduce(comm, send, empty_buf_mut(x.dtype(call.op())?), op, root)
        }
    }
}

pub fn jaxmpi_scan(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let recv = call.ret(0)?.buf_mut(call.op())?;
    backend.scan(
        call.comm()?,
        call.reduction_input()?,
        recv,
        call.reduce_op()?,
    )
}

/// Rank 0 has no prefix to receive; it gets zeros, the exclusive prefix sum's value.
pub fn jaxmpi_exscan(call: &Call, library: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let y = call.ret(0)?;
    let comm = call.comm()?;
    backend.exscan(
        comm,
        call.reduction_input()?,
        y.buf_mut(call.op())?,
        call.reduce_op()?,
    )?;
    if library.comm_rank(comm)? == 0 {
        backend.fill_zeros(y.buf_mut(call.op())?)?;
    }
    Ok(())
}

pub fn jaxmpi_reduce_scatter(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (x, y) = (
        call.arg(0)?.buf(call.op())?,
        call.ret(0)?.buf_mut(call.op())?,
    );
    backend.reduce_scatter(call.comm()?, x, y, call.reduce_op()?)
}

/// The root has no result: its operand is the message, passed read-only without a copy.
pub fn jaxmpi_bcast(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    // Elsewhere the template is no operand: the result is the buffer received into.
    let buf = match call.optional_ret(0) {
        Some(y) => Broadcast::Receiver(y.buf_mut(call.op())?),
        None => Broadcast::Root(call.arg(0)?.buf(call.op())?),
    };
    backend.bcast(call.comm()?, buf, call.int("root")?)
}

pub fn jaxmpi_gather(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (x, root, op) = (call.arg(0)?, call.int("root")?, call.op());
    let recv = match call.optional_ret(0) {
        Some(y) => y.buf_mut(op)?,
        None => empty_buf_mut(x.dtype(op)?),
    };
    backend.gather(call.comm()?, x.buf(op)?, recv, root)
}

pub fn jaxmpi_allgather(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (x, y) = (
        call.arg(0)?.buf(call.op())?,
        call.ret(0)?.buf_mut(call.op())?,
    );
    backend.allgather(call.comm()?, x, y)
}

/// What the root scatters; elsewhere the call has no operand (the template stays in
/// JAX: XLA never sees it).
fn scattered<'a>(
    call: &Call<'a>,
    library: &dyn Library,
    root: i32,
    y: &Operand,
) -> Result<Buf<'a>> {
    if is_root(call, library, root)? {
        call.arg(0)?.buf(call.op())
    } else {
        Ok(empty_buf(y.dtype(call.op())?))
    }
}

pub fn jaxmpi_scatter(call: &Call, library: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (y, root) = (call.ret(0)?, call.int("root")?);
    let send = scattered(call, library, root, &y)?;
    backend.scatter(call.comm()?, send, y.buf_mut(call.op())?, root)
}

pub fn jaxmpi_alltoall(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (x, y) = (
        call.arg(0)?.buf(call.op())?,
        call.ret(0)?.buf_mut(call.op())?,
    );
    backend.alltoall(call.comm()?, x, y)
}

pub fn jaxmpi_gatherv(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (x, root, op) = (call.arg(0)?, call.int("root")?, call.op());
    let (counts, displs) = (call.counts("counts")?, call.counts("displs")?);
    let recv = match call.optional_ret(0) {
        Some(y) => y.buf_mut(op)?,
        None => empty_buf_mut(x.dtype(op)?),
    };
    let recv = PartitionMut::new(recv, &counts, &displs);
    backend.gatherv(call.comm()?, x.buf(op)?, recv, root)
}

pub fn jaxmpi_allgatherv(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (x, y) = (call.arg(0)?, call.ret(0)?);
    let (counts, displs) = (call.counts("counts")?, call.counts("displs")?);
    let op = call.op();
    let recv = PartitionMut::new(y.buf_mut(op)?, &counts, &displs);
    backend.allgatherv(call.comm()?, x.buf(op)?, recv)
}

pub fn jaxmpi_scatterv(call: &Call, library: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (y, root) = (call.ret(0)?, call.int("root")?);
    let (counts, displs) = (call.counts("counts")?, call.counts("displs")?);
    let send = scattered(call, library, root, &y)?;
    let send = Partition::new(send, &counts, &displs);
    backend.scatterv(call.comm()?, send, y.buf_mut(call.op())?, root)
}

pub fn jaxmpi_alltoallv(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (x, y) = (call.arg(0)?, call.ret(0)?);
    let (send_counts, send_displs) = (call.counts("send_counts")?, call.counts("send_displs")?);
    let (recv_counts, recv_displs) = (call.counts("recv_counts")?, call.counts("recv_displs")?);
    let op = call.op();
    let send = Partition::new(x.buf(op)?, &send_counts, &send_displs);
    let recv = PartitionMut::new(y.buf_mut(op)?, &recv_counts, &recv_displs);
    backend.alltoallv(call.comm()?, send, recv)
}

pub fn jaxmpi_send(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let x = call.arg(0)?.buf(call.op())?;
    let tag = call.int("tag")?;
    backend.send(call.comm()?, x, call.peer("dest")?, tag)
}

pub fn jaxmpi_recv(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let y = call.ret(0)?.buf_mut(call.op())?;
    let status = backend.recv(call.comm()?, y, call.peer("source")?, call.tag("tag")?)?;
    fill_status(call, &status)
}

/// The lowering aliases the result to the send buffer when the program sends and
/// receives the same array (`a = sendrecv(a, a)`): then the message is received in place.
pub fn jaxmpi_sendrecv(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let (x, y, op) = (call.arg(0)?, call.ret(0)?, call.op());
    let envelope = Envelope {
        dest: call.peer("dest")?,
        sendtag: call.int("sendtag")?,
        source: call.peer("source")?,
        recvtag: call.tag("recvtag")?,
    };
    let sendbuf = if x.data() == y.data() && y.count() > 0 {
        Input::InPlace
    } else {
        Input::Data(x.buf(op)?)
    };
    let status = backend.sendrecv(call.comm()?, sendbuf, y.buf_mut(op)?, envelope)?;
    fill_status(call, &status)
}

pub fn jaxmpi_barrier(call: &Call, _: &dyn Library, backend: &dyn Backend) -> Result<()> {
    backend.barrier(call.comm()?)
}
