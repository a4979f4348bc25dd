//! XLA FFI handlers: what runs when XLA calls a `jaxmpi_<op>` target. This file is the
//! table of every op (its signature, one line each), which `declare_ops!`
//! (`signature.rs`) turns into the signatures Python reads, each op's typed attributes
//! and its exported handlers. The rest of the folder, by concern:
//! - the op bodies: `ops.rs` (one per op), `hlo.rs` (an adapter per HLO opcode, into the
//!   device-rank layer `xla/mesh/`), `ragged.rs` (counts computed inside `jit`),
//!   `received.rs` (what a completed receive leaves);
//! - `entry.rs`: the one generic path every exported handler takes (metadata probe,
//!   panics, errors), which hands each call to the profile (`profiled.rs`) while one
//!   records;
//! - `services/`: what every call does around its body (its lifecycle and monitor,
//!   checked mode, start verdicts, failures kept for later, the GPU runtime);
//! - `requests/`: the non-blocking machinery (a started op's requests in flight, the
//!   progress agent, the wait).
//!
//! A call is read through `xla/frame/` (its buffers, its attributes and their encoding),
//! which knows no op. The services and the requests read this table (which ops are
//! collectives, checked mode's op numbers: `SIGNATURES`, `Signature::named`) while the
//! table's exported handlers call them: the table is the folder's door, above all of
//! them, and the files below it import one way.

mod entry;
mod hlo;
mod ops;
mod profiled;
pub mod ragged;
mod received;
pub mod requests;
pub mod services;
mod signature;
#[cfg(test)]
mod tests;

pub use crate::xla::mesh::register as register_mesh_comm;
pub(crate) use services::lifecycle::monitor_of;
pub use signature::{
    AttrDecl, Signature, HLO_PASS, NON_BLOCKING, RUN_TIME_COUNTS, STARTED_RESULTS,
};

use crate::xla::ffi::{CallFrame, FfiError, Handler};
use crate::xla::frame::{Address, Attr, Attrs, Call, Counts, Devices, Shown, Sizes, Tree};
use crate::{Backend, Comm, Library, Peer, ReduceOp, Result};
use entry::handle;
use requests::nonblocking;
use services::gpu;
use services::lifecycle::Platform;
use signature::{declare_ops, started_name};

/// An op body (`ops::<name>`, as each row of the table names it): runs the backend op on
/// the call's buffers and its decoded attributes (`Library` for the communicator queries,
/// `Backend` for the op itself).
type Body<A> = fn(&Call, &dyn Library, &dyn Backend, &A) -> Result<()>;

// Every op, declared once: `name: TypedAttrs (operands) -> (results) { attributes }`. The
// lowering `jaxmpi_<name>` passes exactly these (Python checks its parameters against this
// table at trace time); the handler decodes them into `attrs::TypedAttrs` before
// `ops::<name>` runs. A result is absent on ranks that receive nothing (see `ops.rs`), an
// operand that is only a receive template never reaches the handler.
//
// Non-blocking is a mode of an op: `started iname` declares `iname`, the op started, whose
// call runs the op's own body with every MPI call started instead of completed
// (`requests/nonblocking.rs`) and returns a request value before the op's results, which
// only the request's `wait` may read: it takes the request value, the start's other
// results (the op's own, then the operands the transfer reads, passed through), and
// `after`, any number of arrays it never reads that XLA must compute before it; it returns
// the op's results, now complete (aliased). So the op's non-blocking form is this one word
// here.
//
// `host_only REASON`: the op cannot run on GPU buffers (REASON, in `signature.rs`, is what a
// lowering for CUDA says); it gets no CUDA handler. No started form runs there either.
declare_ops! {
    allreduce: Allreduce (x) -> (y) { comm: Comm, op: ReduceOp, tree: Tree } started iallreduce,
    reduce: Reduce (x) -> (y) { comm: Comm, op: ReduceOp, root: i32, tree: Tree } started ireduce,
    scan: Scan (x) -> (y) { comm: Comm, op: ReduceOp, tree: Tree },
    exscan: Exscan (x) -> (y) { comm: Comm, op: ReduceOp, tree: Tree },
    reduce_scatter: ReduceScatter (x) -> (y) { comm: Comm, op: ReduceOp, tree: Tree }
        started ireduce_scatter,
    bcast: Bcast (x) -> (y) { comm: Comm, root: i32, tree: Tree } started ibcast,
    gather: Gather (x) -> (y) { comm: Comm, root: i32, tree: Tree } started igather,
    allgather: Allgather (x) -> (y) { comm: Comm, tree: Tree } started iallgather,
    scatter: Scatter (x) -> (y) { comm: Comm, root: i32, tree: Tree } started iscatter,
    alltoall: Alltoall (x) -> (y) { comm: Comm, tree: Tree } started ialltoall,
    gatherv: Gatherv (x) -> (y) { comm: Comm, root: i32, counts: Counts, tree: Tree }
        started igatherv,
    allgatherv: Allgatherv (x) -> (y) { comm: Comm, counts: Counts, tree: Tree }
        started iallgatherv,
    scatterv: Scatterv (x) -> (y) { comm: Comm, root: i32, counts: Counts, tree: Tree }
        started iscatterv,
    alltoallv: Alltoallv (x) -> (y) {
        comm: Comm, send_counts: Counts, recv_counts: Counts, tree: Tree,
    } started ialltoallv,
    send: Send (x) -> () { comm: Comm, dest: Peer, tag: i32, tree: Tree } started isend,
    recv: Recv (x) -> (y) {
        comm: Comm, source: Peer, tag: Option<i32>, status: Address, tree: Tree,
    } started irecv,
    sendrecv: Sendrecv (sendbuf, recvbuf) -> (y) {
        comm: Comm, dest: Peer, sendtag: i32, source: Peer, recvtag: Option<i32>, status: Address,
        tree: Tree, recv_tree: Tree,
    },
    barrier: Barrier () -> () { comm: Comm },
    wait: Wait (request, buffers, after) -> (results) { comm: Comm } host_only NON_BLOCKING,
    // Counts computed inside jit: operands, read at run time (`ragged.rs`); `output` is
    // the result's initial contents (aliased: rows nobody sends to stay as they are).
    ragged_alltoallv: RaggedAlltoallv (x, output, send_displs, send_counts, recv_displs, recv_counts)
        -> (y) { comm: Comm, origin: i32, tree: Tree } host_only RUN_TIME_COUNTS,
    // XLA's collectives, as the HLO pass (`xla/hlo`) rewrites them (`hlo.rs`): on every
    // device of a sharded program, with their devices' groups instead of a communicator,
    // and the JAX operation they came from. `x`/`y`: one or more arrays (all-reduce and
    // all-to-all take several); `outer`: per array, the slices outside the collective's
    // dimension. ragged_all_to_all's result starts as `output` (aliased where the pass
    // found it safe).
    hlo_all_reduce: HloAllReduce (x) -> (y) { groups: Devices, op: ReduceOp, origin: Shown }
        host_only HLO_PASS,
    hlo_all_gather: HloAllGather (x) -> (y) { groups: Devices, outer: Sizes, origin: Shown }
        host_only HLO_PASS,
    hlo_reduce_scatter: HloReduceScatter (x) -> (y) {
        groups: Devices, outer: Sizes, op: ReduceOp, origin: Shown,
    } host_only HLO_PASS,
    hlo_all_to_all: HloAllToAll (x) -> (y) { groups: Devices, outer: Sizes, origin: Shown }
        host_only HLO_PASS,
    hlo_collective_permute: HloCollectivePermute (x) -> (y) { pairs: Devices, origin: Shown }
        host_only HLO_PASS,
    hlo_ragged_all_to_all: HloRaggedAllToAll (
        input, output, input_offsets, send_sizes, output_offsets, recv_sizes
    ) -> (y) { groups: Devices, origin: Shown } host_only HLO_PASS,
    // The pass's prologue of a program, before its first MPI call: `groups` lists every
    // group of devices its collectives name, whose communicators among processes it makes
    // at the program's first run.
    hlo_communicators: HloCommunicators () -> () { groups: Devices } host_only HLO_PASS,
}
