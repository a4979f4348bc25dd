//! Op bodies: the backend call of each op, given its operands, results and typed
//! attributes (declared in the table in `mod.rs`). Result conventions follow mpi4jax: ranks
//! that receive nothing return their input. The rooted ops bind no result on those ranks
//! (the Python side returns the input), so the presence of a result is what tells a body
//! whether this rank receives.

pub use super::hlo::{
    hlo_all_gather, hlo_all_reduce, hlo_all_to_all, hlo_collective_permute, hlo_communicators,
    hlo_ragged_all_to_all, hlo_reduce_scatter,
};
pub use super::ragged::ragged_alltoallv;
pub use super::requests::nonblocking::wait;

use super::attrs;
use super::received::{fill_status, whole_message};
use super::services::checked;
use crate::xla::frame::{Call, Operand};
use crate::{
    Backend, Broadcast, Buf, BufMut, Dtype, Envelope, Input, Library, Partition, PartitionMut,
    Result,
};

fn empty_buf<'a>(dtype: Dtype) -> Buf<'a> {
    // SAFETY: zero elements: nothing is ever read.
    unsafe { Buf::from_raw(std::ptr::null(), 0, dtype) }
}

fn empty_buf_mut<'a>(dtype: Dtype) -> BufMut<'a> {
    // SAFETY: zero elements: nothing is ever written.
    unsafe { BufMut::from_raw(std::ptr::null_mut(), 0, dtype) }
}

pub fn allreduce(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Allreduce,
) -> Result<()> {
    let recv = call.ret(0)?.buf_mut()?;
    backend.allreduce(a.comm, call.reduction_input()?, recv, a.op)
}

/// Inside shard_map (one program for every rank) the result is bound on every rank,
/// aliased to the operand: `Input::InPlace` there is the backend's to read as MPI allows
/// (MPI_IN_PLACE at the root, the receive buffer as the input elsewhere).
pub fn reduce(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Reduce,
) -> Result<()> {
    match call.optional_ret(0) {
        Some(y) => backend.reduce(a.comm, call.reduction_input()?, y.buf_mut()?, a.op, a.root),
        None => {
            let x = call.arg(0)?;
            let send = Input::Data(x.buf()?);
            backend.reduce(a.comm, send, empty_buf_mut(x.dtype()?), a.op, a.root)
        }
    }
}

pub fn scan(call: &Call, _: &dyn Library, backend: &dyn Backend, a: &attrs::Scan) -> Result<()> {
    let recv = call.ret(0)?.buf_mut()?;
    backend.scan(a.comm, call.reduction_input()?, recv, a.op)
}

/// Rank 0 has no prefix to receive; it gets zeros, the exclusive prefix sum's value.
pub fn exscan(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Exscan,
) -> Result<()> {
    let y = call.ret(0)?;
    let recv = y.buf_mut()?;
    backend.exscan(a.comm, call.reduction_input()?, recv, a.op)?;
    if library.comm_rank(a.comm)? == 0 {
        backend.fill_zeros(y.buf_mut()?)?;
    }
    Ok(())
}

pub fn reduce_scatter(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::ReduceScatter,
) -> Result<()> {
    let (x, y) = (call.arg(0)?.buf()?, call.ret(0)?.buf_mut()?);
    backend.reduce_scatter(a.comm, x, y, a.op)
}

/// Three shapes of call, none of which needs to ask which rank this is:
/// - the root (its lowering knew) has no result: its operand is the message, which
///   MPI_Bcast only reads there (the `Backend::bcast` contract), passed without a copy;
/// - another rank has no operand (the template stays in JAX): the result is received into;
/// - one program for every rank (inside shard_map, on a MeshComm) has both, the result
///   aliased to the operand: one buffer on every rank, as MPI_Bcast takes it.
pub fn bcast(call: &Call, _: &dyn Library, backend: &dyn Backend, a: &attrs::Bcast) -> Result<()> {
    let buf = match (call.optional_ret(0), call.optional_arg(0)) {
        (Some(y), None) => Broadcast::Receiver(y.buf_mut()?),
        (Some(y), Some(_)) => Broadcast::InPlace(y.buf_mut()?),
        (None, _) => Broadcast::Root(call.arg(0)?.buf()?),
    };
    backend.bcast(a.comm, buf, a.root)
}

pub fn gather(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Gather,
) -> Result<()> {
    let (x, y) = (call.arg(0)?, call.optional_ret(0));
    let at_root = backend.gather(a.comm, x.buf()?, gathered_into(&x, &y)?, a.root)?;
    zeros_away_from_root(&y, backend, at_root)
}

/// Where a gather's root receives: its result; none elsewhere, except where one program
/// serves every rank (inside shard_map, on a MeshComm) and binds the root's result on
/// every rank.
fn gathered_into<'a>(x: &Operand, y: &Option<Operand<'a>>) -> Result<BufMut<'a>> {
    match y {
        Some(y) => y.buf_mut(),
        None => Ok(empty_buf_mut(x.dtype()?)),
    }
}

/// A gather's result bound away from the root (which MPI does not write there) is zeros.
/// The backend says whether this rank is the root: it asks the communicator anyway.
fn zeros_away_from_root(y: &Option<Operand>, backend: &dyn Backend, at_root: bool) -> Result<()> {
    match y {
        Some(y) if !at_root => backend.fill_zeros(y.buf_mut()?),
        _ => Ok(()),
    }
}

pub fn allgather(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Allgather,
) -> Result<()> {
    let (x, y) = (call.arg(0)?.buf()?, call.ret(0)?.buf_mut()?);
    backend.allgather(a.comm, x, y)
}

/// What the root scatters. Elsewhere the call has no operand (the template stays in JAX:
/// XLA never sees it), except where one program serves every rank (inside shard_map, on a
/// MeshComm): there the backend reads the operand at the root only, as MPI_Scatter does.
fn scattered<'a>(call: &Call<'a>, y: &Operand) -> Result<Buf<'a>> {
    match call.optional_arg(0) {
        Some(x) => x.buf(),
        None => Ok(empty_buf(y.dtype()?)),
    }
}

pub fn scatter(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Scatter,
) -> Result<()> {
    let y = call.ret(0)?;
    let send = scattered(call, &y)?;
    backend.scatter(a.comm, send, y.buf_mut()?, a.root)
}

pub fn alltoall(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Alltoall,
) -> Result<()> {
    let (x, y) = (call.arg(0)?.buf()?, call.ret(0)?.buf_mut()?);
    backend.alltoall(a.comm, x, y)
}

// The v-ops get counts in rows; a row of the operand (or, where a rank has none, of the
// result) is what turns them into the element counts and displacements MPI takes.

pub fn gatherv(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Gatherv,
) -> Result<()> {
    let (x, y) = (call.arg(0)?, call.optional_ret(0));
    let (counts, displs) = a.counts.elements(x.row());
    let recv = PartitionMut::new(gathered_into(&x, &y)?, &counts, &displs);
    let at_root = backend.gatherv(a.comm, x.buf()?, recv, a.root)?;
    zeros_away_from_root(&y, backend, at_root)
}

pub fn allgatherv(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Allgatherv,
) -> Result<()> {
    let (x, y) = (call.arg(0)?, call.ret(0)?);
    let (counts, displs) = a.counts.elements(x.row());
    let recv = PartitionMut::new(y.buf_mut()?, &counts, &displs);
    backend.allgatherv(a.comm, x.buf()?, recv)
}

pub fn scatterv(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Scatterv,
) -> Result<()> {
    let y = call.ret(0)?;
    let (counts, displs) = a.counts.elements(y.row());
    let send = scattered(call, &y)?;
    let send = Partition::new(send, &counts, &displs);
    backend.scatterv(a.comm, send, y.buf_mut()?, a.root)
}

pub fn alltoallv(
    call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Alltoallv,
) -> Result<()> {
    let (x, y) = (call.arg(0)?, call.ret(0)?);
    let (send_counts, send_displs) = a.send_counts.elements(x.row());
    let (recv_counts, recv_displs) = a.recv_counts.elements(x.row());
    let send = Partition::new(x.buf()?, &send_counts, &send_displs);
    let recv = PartitionMut::new(y.buf_mut()?, &recv_counts, &recv_displs);
    backend.alltoallv(a.comm, send, recv)
}

pub fn send(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Send,
) -> Result<()> {
    let x = call.arg(0)?.buf()?;
    // Started (isend), no header: a receive of its own waiting for it would block the
    // start of the receiving rank's other transfers.
    if checked::enabled() && !call.is_start() {
        let message = checked::Message {
            dtype: x.dtype(),
            count: x.count(),
            tree: a.tree.of(call),
        };
        checked::send_header(library, a.comm, a.dest, a.tag, message)?;
    }
    backend.send(a.comm, x, a.dest, a.tag)
}

pub fn recv(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Recv,
) -> Result<()> {
    let y = call.ret(0)?;
    let (mut source, mut tag, mut mismatch) = (a.source, a.tag, None);
    if checked::enabled() && !call.is_start() {
        let expected = checked::Message {
            dtype: y.dtype()?,
            count: y.count(),
            tree: a.tree.of(call),
        };
        let announced = checked::receive_header(library, a.comm, (source, tag), expected)?;
        (source, tag, mismatch) = (announced.source, announced.tag, announced.mismatch);
    }
    let received = backend.recv(a.comm, y.buf_mut()?, source, tag);
    if call.is_start() {
        // Nothing received yet (irecv): its completion checks and reports the message.
        return received.map(|_| ());
    }
    let status = mismatch.map_or(received, Err)?;
    whole_message(y.buf_mut()?, &status, a.status, backend)?;
    fill_status(a.status, &status);
    Ok(())
}

/// The lowering aliases the result to the send buffer when the program sends and
/// receives the same array (`a = sendrecv(a, a)`): then the message is received in place.
pub fn sendrecv(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Sendrecv,
) -> Result<()> {
    let (x, y) = (call.arg(0)?, call.ret(0)?);
    let mut envelope = Envelope {
        comm: a.comm,
        dest: a.dest,
        sendtag: a.sendtag,
        source: a.source,
        recvtag: a.recvtag,
    };
    let mut mismatch = None;
    if checked::enabled() {
        let sent = checked::Message {
            dtype: x.dtype()?,
            count: x.count(),
            tree: a.tree.of(call),
        };
        let expected = checked::Message {
            dtype: y.dtype()?,
            count: y.count(),
            tree: a.recv_tree.of(call),
        };
        let announced = checked::exchange_headers(library, envelope, sent, expected)?;
        (envelope.source, envelope.recvtag) = (announced.source, announced.tag);
        mismatch = announced.mismatch;
    }
    let sendbuf = if x.data() == y.data() && y.count() > 0 {
        Input::InPlace
    } else {
        Input::Data(x.buf()?)
    };
    let received = backend.sendrecv(sendbuf, y.buf_mut()?, envelope);
    // A mismatch the headers showed is the error to report, whatever the transfer did.
    let status = mismatch.map_or(received, Err)?;
    whole_message(y.buf_mut()?, &status, a.status, backend)?;
    fill_status(a.status, &status);
    Ok(())
}

pub fn barrier(
    _call: &Call,
    _: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::Barrier,
) -> Result<()> {
    backend.barrier(a.comm)
}
