//! Communicators (rank, size, dup, split, free, check_comm) and the inputs a backend must
//! refuse with an error instead of passing them to MPI.

use jaxmpi_core::{
    Broadcast, Comm, Dtype, Envelope, Family, Input, Partition, PartitionMut, Peer, ReduceOp,
};

use crate::array::{Array, Value};
use crate::report::{Group, Probe};

/// The world communicator as a group, or `None` if its rank or size cannot be had (then
/// no collective can be trusted to complete).
pub fn world(p: &mut Probe) -> Option<Group> {
    let (l, comm) = (p.library, p.library.world());
    let rank = p.ok("comm_rank of world", l.comm_rank(comm))?;
    let size = p.ok("comm_size of world", l.comm_size(comm))?;
    Some(Group {
        comm,
        name: "world",
        rank,
        size,
    })
}

/// Every rank must have a distinct rank in 0..size, and world must pass check_comm while
/// a handle of another family's shape must not (nor crash the process).
pub fn world_checks(p: &mut Probe, g: &Group) {
    p.start("world checks");
    let (b, l) = (p.backend, p.library);
    p.ok("barrier on world", b.barrier(g.comm));
    let mine = Array::from_fn(Dtype::I32, 1, |_| Value::Int(g.rank.into()));
    let mut all = Array::zeroed(Dtype::I32, g.size as usize);
    let expected = Array::from_fn(Dtype::I32, g.size as usize, |i| Value::Int(i as i128));
    let result = b.allgather(g.comm, mine.buf(), all.buf_mut());
    p.result("allgather of world ranks", result, &expected, &all);
    p.ok("check_comm of world", l.check_comm(g.comm));
    let foreign = match l.info().family {
        // A pointer, as Open MPI and the MPI-5 ABI hand out.
        Family::Mpich => 0x7f00_1234_5670,
        // MPICH's MPI_COMM_WORLD: an integer where a pointer is expected.
        Family::OpenMpi | Family::MpiAbi => 0x4400_0000,
    };
    p.refused(
        &format!("check_comm of foreign handle {foreign:#x}"),
        l.check_comm(Comm(foreign)),
    );
}

/// Communicators derived from world: a dup, a split by parity (in reverse rank order) and
/// a split that leaves the last rank out. `suite` runs on each that this rank belongs to.
pub fn derived(p: &mut Probe, world: &Group, suite: impl Fn(&mut Probe, &Group)) {
    p.start("derived communicators");
    let b = p.library;
    if let Some(comm) = p.ok("comm_dup of world", b.comm_dup(world.comm)) {
        if let Some(g) = group(p, comm, "dup", world.rank, world.size) {
            p.ok("check_comm of dup", b.check_comm(comm));
            suite(p, &g);
            crate::p2p::library_errors(p, &g);
        }
        p.ok("comm_free of dup", b.comm_free(comm));
    }

    // key = -rank reverses the order: the highest world rank of each parity comes first.
    let color = world.rank % 2;
    let members = (0..world.size).filter(|r| r % 2 == color);
    let above = members.clone().filter(|&r| r > world.rank).count() as i32;
    let split = b.comm_split(world.comm, Some(color), -world.rank);
    match p.ok("comm_split by parity", split) {
        Some(Some(comm)) => {
            if let Some(g) = group(p, comm, "split", above, members.count() as i32) {
                p.ok("check_comm of split", b.check_comm(comm));
                suite(p, &g);
            }
            p.ok("comm_free of split", b.comm_free(comm));
        }
        Some(None) => p.fail("comm_split by parity", "a communicator", "None"),
        None => {}
    }

    let last = world.rank == world.size - 1;
    let split = b.comm_split(world.comm, (!last).then_some(3), 0);
    match p.ok("comm_split with MPI_UNDEFINED on the last rank", split) {
        Some(None) if last => {}
        Some(Some(comm)) if !last => {
            if let Some(g) = group(p, comm, "split without last", world.rank, world.size - 1) {
                suite(p, &g);
            }
            p.ok("comm_free of split without last", b.comm_free(comm));
        }
        Some(got) => p.fail(
            "comm_split with MPI_UNDEFINED on the last rank",
            if last { "None" } else { "a communicator" },
            format!("{got:?}"),
        ),
        None => {}
    }
}

/// A derived communicator as a group, if its rank and size are the expected ones: with
/// any other, the tests' assumptions about who sends what would not hold.
fn group(p: &mut Probe, comm: Comm, name: &'static str, rank: i32, size: i32) -> Option<Group> {
    let b = p.library;
    let got_rank = p.ok(&format!("comm_rank of {name}"), b.comm_rank(comm))?;
    let got_size = p.ok(&format!("comm_size of {name}"), b.comm_size(comm))?;
    let label = format!("(rank, size) of {name}");
    p.check(&label, (rank, size), (got_rank, got_size))
        .then_some(Group {
            comm,
            name,
            rank,
            size,
        })
}

/// Each of these is refused before MPI is called, identically on every rank (so no rank
/// is left waiting in a collective), and the communicator works afterwards.
pub fn bad_input(p: &mut Probe, g: &Group) {
    p.start("bad input");
    let (b, comm, size) = (p.backend, g.comm, g.size as usize);
    let ints = Array::zeroed(Dtype::I32, 7);
    let floats = Array::zeroed(Dtype::F32, 7);
    let mut out = Array::zeroed(Dtype::I32, 7);
    let mut out8 = Array::zeroed(Dtype::I32, 8);
    let mut float_out = Array::zeroed(Dtype::F32, 7);
    // One element more than any whole number of blocks.
    let mut gathered = Array::zeroed(Dtype::I32, 7 * size + 1);
    let odd = Array::zeroed(Dtype::I32, 7 * size + 1);
    let counts = vec![7; size];
    let displs: Vec<usize> = (0..size).map(|j| 7 * j).collect();
    let sum = ReduceOp::Sum;

    let bcast = b.bcast(comm, Broadcast::Receiver(out.buf_mut()), g.size);
    p.refused("bcast root=size", bcast);
    let bcast = b.bcast(comm, Broadcast::Receiver(out.buf_mut()), -1);
    p.refused("bcast root=-1", bcast);
    let reduced = b.reduce(comm, Input::Data(ints.buf()), out.buf_mut(), sum, g.size);
    p.refused("reduce root=size", reduced);
    let gathered_at = b
        .gather(comm, ints.buf(), gathered.buf_mut(), g.size + 3)
        .map(|_| ());
    p.refused("gather root=size+3", gathered_at);
    p.refused("send to ANY_SOURCE", b.send(comm, ints.buf(), Peer::Any, 1));
    let to_any = Envelope {
        comm,
        dest: Peer::Any,
        sendtag: 1,
        source: Peer::Null,
        recvtag: None,
    };
    let sendrecv = b.sendrecv(Input::Data(ints.buf()), out.buf_mut(), to_any);
    p.refused("sendrecv to ANY_SOURCE", sendrecv);
    let mismatched = b.allreduce(comm, Input::Data(ints.buf()), out8.buf_mut(), sum);
    p.refused("allreduce of 7 elements into 8", mismatched);
    let mixed = b.allreduce(comm, Input::Data(ints.buf()), float_out.buf_mut(), sum);
    p.refused("allreduce of int32 into float32", mixed);
    let band = b.allreduce(
        comm,
        Input::Data(floats.buf()),
        float_out.buf_mut(),
        ReduceOp::Band,
    );
    p.refused("allreduce BAND on float32", band);
    p.refused(
        "allgather into a buffer of the wrong length",
        b.allgather(comm, ints.buf(), gathered.buf_mut()),
    );
    let short_counts = &counts[1..];
    let recv = PartitionMut::new(gathered.buf_mut(), short_counts, &displs);
    let v = b.allgatherv(comm, ints.buf(), recv);
    p.refused("allgatherv with size-1 counts", v);
    let mut far = displs.clone();
    far[0] = 7 * size;
    let recv = PartitionMut::new(gathered.buf_mut(), &counts, &far);
    let v = b.allgatherv(comm, ints.buf(), recv);
    p.refused("allgatherv with a block past the buffer", v);
    let long_counts = [counts.as_slice(), &[0]].concat();
    let send = Partition::new(ints.buf(), &long_counts, &displs);
    let v = b.alltoallv(
        comm,
        send,
        PartitionMut::new(out.buf_mut(), &counts, &displs),
    );
    p.refused("alltoallv with size+1 send counts", v);
    let scattered = b.reduce_scatter(comm, ints.buf(), out.buf_mut(), sum);
    if size > 1 {
        p.refused("reduce_scatter of 7 elements for 7 per rank", scattered);
        let uneven = b.alltoall(comm, odd.buf(), gathered.buf_mut());
        p.refused("alltoall of 7*size+1 elements in equal blocks", uneven);
    } else {
        p.ok("reduce_scatter on one rank", scattered);
    }
    let l = p.library;
    p.refused("comm_split with color -5", l.comm_split(comm, Some(-5), 0));
    p.refused("comm_free of world", l.comm_free(l.world()));
    let null = b.allreduce(Comm(0), Input::Data(ints.buf()), out.buf_mut(), sum);
    p.refused("allreduce on communicator handle 0", null);
    p.ok("barrier after refused calls", b.barrier(comm));
}
